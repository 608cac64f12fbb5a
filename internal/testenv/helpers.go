package testenv

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Clientset returns a clientset for the admin, or for RestrictedUser when
// restricted is set.
func (e *Env) Clientset(tb testing.TB, restricted bool) *kubernetes.Clientset {
	tb.Helper()
	cfg := e.AdminConfig()
	if restricted {
		cfg = e.RestrictedConfig()
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return cs
}

var (
	nsSeq  atomic.Int64
	nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)
)

// Namespace creates a namespace of the test's own, named after it.
func (e *Env) Namespace(tb testing.TB) string {
	tb.Helper()
	base := strings.Trim(nonDNS.ReplaceAllString(strings.ToLower(tb.Name()), "-"), "-")
	if len(base) > 40 {
		base = base[:40]
	}
	ns := fmt.Sprintf("%s-%d", base, nsSeq.Add(1))
	_, err := e.Clientset(tb, false).CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return ns
}

// Grant gives RestrictedUser the rules through a Role and RoleBinding
// called name in ns. If probe is set, Grant then waits (up to 10 s) until
// the authorizer has caught up: until probe, a request made with the
// restricted identity, returns anything but Forbidden.
func (e *Env) Grant(tb testing.TB, ns, name string, rules []rbacv1.PolicyRule, probe func(context.Context) error) {
	tb.Helper()
	ctx := context.Background()
	admin := e.Clientset(tb, false)
	_, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      rules,
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: RestrictedUser}},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	if probe == nil {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := probe(ctx)
		if err == nil || apierrors.IsNotFound(err) {
			return
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			tb.Fatalf("waiting for RBAC: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
