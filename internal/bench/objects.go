package bench

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The objects written to the real apiserver while recording. They look like
// what a Deployment's ReplicaSet and a kubelet produce: two containers with
// env, probes, resources and mounts, owner references, tolerations, a
// projected service-account token (added by the apiserver's admission), and
// a full status once "running". Field managers are named after the
// components that write those fields, so managedFields are realistic too.

const (
	managerRS      = "kube-controller-manager"
	managerKubelet = "kubelet"
	managerKubectl = "kubectl-annotate"
)

// benchPod is the pod as its ReplicaSet would create it.
func benchPod(ns string, i int) *corev1.Pod {
	app := fmt.Sprintf("svc-%02d", i%37)
	hash := fmt.Sprintf("%09x", 0x75f3c2a10+i%37)
	name := fmt.Sprintf("%s-%s-%05d", app, hash, i)
	labels := map[string]string{
		"app.kubernetes.io/name":      app,
		"app.kubernetes.io/part-of":   "shop",
		"app.kubernetes.io/version":   "2.14." + strconv.Itoa(i%9),
		"app.kubernetes.io/component": "api",
		"pod-template-hash":           hash,
	}
	probe := func(path string, port int) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(int32(port)), Scheme: corev1.URISchemeHTTP}},
			TimeoutSeconds:   1,
			PeriodSeconds:    10,
			SuccessThreshold: 1,
			FailureThreshold: 3,
		}
	}
	sec := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptrTo(false),
		ReadOnlyRootFilesystem:   ptrTo(true),
		RunAsNonRoot:             ptrTo(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, GenerateName: app + "-" + hash + "-", Namespace: ns, Labels: labels,
			Annotations: map[string]string{
				"kubectl.kubernetes.io/restartedAt": "2026-03-14T09:26:41Z",
				"prometheus.io/port":                "9090",
				"prometheus.io/scrape":              "true",
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-" + hash,
				UID:        "a8b7c6d5-e4f3-4a2b-9c1d-0e9f8a7b6c5d",
				Controller: ptrTo(true), BlockOwnerDeletion: ptrTo(true),
			}},
		},
		Spec: corev1.PodSpec{
			NodeName: fmt.Sprintf("node-%02d.eu-west-1.compute.internal", i%23),
			Containers: []corev1.Container{{
				Name:  "api",
				Image: "registry.example.com/shop/" + app + ":2.14." + strconv.Itoa(i%9),
				Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
					{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
				},
				Env: []corev1.EnvVar{
					{Name: "LOG_LEVEL", Value: "info"},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "DATABASE_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: app + "-db"}, Key: "url"}}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
				},
				VolumeMounts:    []corev1.VolumeMount{{Name: "config", MountPath: "/etc/" + app, ReadOnly: true}},
				LivenessProbe:   probe("/healthz", 8080),
				ReadinessProbe:  probe("/readyz", 8080),
				ImagePullPolicy: corev1.PullIfNotPresent,
				SecurityContext: sec,
			}, {
				Name:            "proxy",
				Image:           "registry.example.com/mesh/proxy:1.22.3",
				Args:            []string{"--listen=:15001", "--upstream=127.0.0.1:8080", "--log-format=json"},
				Ports:           []corev1.ContainerPort{{Name: "proxy", ContainerPort: 15001, Protocol: corev1.ProtocolTCP}},
				Resources:       corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
				ImagePullPolicy: corev1.PullIfNotPresent,
				SecurityContext: sec,
			}},
			Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: app + "-config"}}}}},
			SecurityContext:               &corev1.PodSecurityContext{FSGroup: ptrTo(int64(2000)), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			TerminationGracePeriodSeconds: ptrTo(int64(30)),
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
				MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway,
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": app}},
			}},
		},
	}
}

// kubeletStatus sets the status a kubelet reports: starting (running=false)
// or running and ready.
func kubeletStatus(p *corev1.Pod, i int, running bool) {
	t0 := metav1.NewTime(time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(7 * time.Second))
	cond := func(t corev1.PodConditionType, ok bool, at metav1.Time) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		c := corev1.PodCondition{Type: t, Status: s, LastTransitionTime: at}
		if !ok {
			c.Reason = "ContainersNotReady"
			c.Message = "containers with unready status: [api proxy]"
		}
		return c
	}
	st := corev1.PodStatus{
		Phase:     corev1.PodPending,
		HostIP:    fmt.Sprintf("10.0.%d.%d", i%23, 10+i%200),
		HostIPs:   []corev1.HostIP{{IP: fmt.Sprintf("10.0.%d.%d", i%23, 10+i%200)}},
		StartTime: &t0,
		QOSClass:  corev1.PodQOSBurstable,
	}
	var cs []corev1.ContainerStatus
	for _, c := range p.Spec.Containers {
		s := corev1.ContainerStatus{Name: c.Name, Image: c.Image, Started: ptrTo(running), Ready: running}
		if running {
			s.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: t1}}
			s.ImageID = c.Image + "@sha256:9b2d3c4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff0011"
			s.ContainerID = fmt.Sprintf("containerd://%064x", i*31+len(c.Name))
		} else {
			s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
		}
		cs = append(cs, s)
	}
	st.ContainerStatuses = cs
	st.Conditions = []corev1.PodCondition{
		cond("PodReadyToStartContainers", running, t1),
		cond(corev1.PodInitialized, true, t0),
		cond(corev1.PodReady, running, t1),
		cond(corev1.ContainersReady, running, t1),
		cond(corev1.PodScheduled, true, t0),
	}
	if running {
		st.Phase = corev1.PodRunning
		st.PodIP = fmt.Sprintf("10.244.%d.%d", i%250, 2+i%250)
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
	}
	p.Status = st
}

// benchWidget is a custom resource as kubectl apply leaves it: labels and
// the last-applied-configuration annotation.
func benchWidget(ns string, i int) map[string]any {
	name := fmt.Sprintf("widget-%05d", i)
	color := []string{"red", "green", "blue", "amber"}[i%4]
	applied := fmt.Sprintf(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"annotations":{},"labels":{"app.kubernetes.io/name":"widgets","team":"checkout"},"name":%q,"namespace":%q},"spec":{"color":%q,"size":%d}}`+"\n",
		name, ns, color, i%10)
	return map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{
			"name": name, "namespace": ns,
			"labels":      map[string]any{"app.kubernetes.io/name": "widgets", "team": "checkout", "tier": "gold"},
			"annotations": map[string]any{"kubectl.kubernetes.io/last-applied-configuration": applied},
		},
		"spec": map[string]any{"color": color, "size": int64(i % 10)},
	}
}

// benchConfigMap is the template of the objects replayed for the memory
// measurement: a small ConfigMap with labels and three keys.
func benchConfigMap(ns string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: "cm-template-000000", Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": "shop", "app.kubernetes.io/component": "config"},
		},
		Data: map[string]string{
			"LOG_LEVEL":     "info",
			"FEATURE_FLAGS": "checkout-v2,fast-search,no-legacy-cart",
			"app.yaml":      "server:\n  port: 8080\n  readTimeout: 5s\nupstreams:\n  payments: http://payments.shop.svc:8080\n  stock: http://stock.shop.svc:8080\n",
		},
	}
}

func ptrTo[T any](v T) *T { return &v }
