// Package testenv starts real servers for relayd's tests and demo: etcd and
// kube-apiserver as child processes (binaries built by `make testenv-bins`
// from the tools/ and tools/k8s-v1.35/ modules), and nats-server with
// JetStream embedded in the calling process.
//
// Two Kubernetes versions are provided (Versions): K8sVersion, the default,
// and K8sVersionPrev, the oldest minor still in upstream support when
// K8sVersion was released. Options.Version picks one; Env.Sibling gives a
// package's tests one shared Env per version.
//
// Everything listens on 127.0.0.1 with free ports and lives in a temp dir.
// Child processes are started with Pdeathsig, so they die with the test
// binary even when it panics or is killed; Stop also kills them by PID.
//
// Typical use, once per test package:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) {
//		os.Exit(testenv.Main(m, testenv.Options{}, &env))
//	}
package testenv

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/relayd/relayd/internal/testutil"
)

// Versions of the test servers; hack/testenv-bins.sh builds exactly these.
const (
	// K8sVersion is the default kube-apiserver (tools/go.mod), in
	// $RELAYD_TESTENV_BIN.
	K8sVersion = "v1.37.1"
	// K8sVersionPrev is the oldest kube-apiserver minor still in upstream
	// support when K8sVersion was released (tools/k8s-v1.35/go.mod), in
	// $RELAYD_TESTENV_BIN_PREV. It runs on the same etcd.
	K8sVersionPrev = "v1.35.4"
	EtcdVersion    = "v3.7.0"
)

// binDirEnv names the variable that locates each version's binaries.
var binDirEnv = map[string]string{
	K8sVersion:     "RELAYD_TESTENV_BIN",
	K8sVersionPrev: "RELAYD_TESTENV_BIN_PREV",
}

// Identities known to the apiserver's token file.
const (
	AdminUser       = "admin" // member of system:masters
	adminToken      = "relayd-testenv-admin-token"
	RestrictedUser  = "relayd" // no permissions until a test grants them
	restrictedToken = "relayd-testenv-restricted-token"
)

// Options selects the apiserver flavour.
type Options struct {
	// Version is the Kubernetes version to run, one of Versions(); empty
	// means K8sVersion.
	Version string
	// DisableWatchCache starts kube-apiserver with --watch-cache=false, so a
	// watch from a compacted resourceVersion gets 410 Expired right after
	// CompactNow. Periodic bookmarks do not arrive in this flavour.
	DisableWatchCache bool
	// ExtraAPIServerArgs are appended to the kube-apiserver command line.
	ExtraAPIServerArgs []string
	// Dir is the working directory; a new temp dir when empty. It is removed
	// by Stop only when testenv created it.
	Dir string
	// AuditLog makes kube-apiserver write an audit log of every list and
	// watch request (AuditEvents reads it), so a test can see which
	// requests a client made and how the server answered them.
	AuditLog bool
	// Logf receives progress lines (nil: silent).
	Logf func(format string, args ...any)
}

// Env is a running etcd + kube-apiserver pair.
type Env struct {
	opts    Options
	version string
	dir     string
	ownsDir bool
	binDir  string

	siblingsMu sync.Mutex
	siblings   map[string]*Env // other versions, by version; stopped by Stop

	etcd       *proc
	etcdURL    string
	etcdPeer   int
	apiserver  *proc
	apiPort    int
	caFile     string
	apiArgs    []string
	restartCnt int
}

// BinDir returns the folder holding the etcd and kube-apiserver binaries of
// K8sVersion: $RELAYD_TESTENV_BIN, else <repo>/.cache/testenv/k8s-<v>-etcd-<v>.
func BinDir() (string, error) { return BinDirOf(K8sVersion) }

// BinDirOf returns the folder holding the etcd and kube-apiserver binaries
// of Kubernetes version v: $RELAYD_TESTENV_BIN for K8sVersion,
// $RELAYD_TESTENV_BIN_PREV for K8sVersionPrev, else
// <repo>/.cache/testenv/k8s-<v>-etcd-<v> (where `make testenv-bins` puts them).
func BinDirOf(v string) (string, error) {
	envVar, ok := binDirEnv[v]
	if !ok {
		return "", fmt.Errorf("testenv: Kubernetes version %q is not provided; the test env has %v", v, Versions())
	}
	if d := os.Getenv(envVar); d != "" {
		return d, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache", "testenv", "k8s-"+v+"-etcd-"+EtcdVersion), nil
}

// Versions lists the Kubernetes versions the test env provides, K8sVersion
// first. Every one of them must be built (`make testenv-bins`): tests that
// run against each version fail, never skip, when one is missing
// (CheckVersions, VersionsT).
func Versions() []string { return []string{K8sVersion, K8sVersionPrev} }

// CheckVersions checks that the binaries of every version of Versions are
// where BinDirOf says and report the right versions.
func CheckVersions() error {
	var errs []error
	for _, v := range Versions() {
		dir, err := BinDirOf(v)
		if err == nil {
			err = checkBinaries(dir, v)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// VersionsT is Versions for a test: it fails tb (CheckVersions) when the
// binaries of any version are missing or of another version.
func VersionsT(tb testing.TB) []string {
	tb.Helper()
	if err := CheckVersions(); err != nil {
		tb.Fatal(err)
	}
	return Versions()
}

// repoRoot is the repository root, for the default binaries folder.
func repoRoot() (string, error) {
	dir, err := testutil.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("testenv: %w; set RELAYD_TESTENV_BIN", err)
	}
	return dir, nil
}

// checked caches checkBinaries' successes by folder and version, so that
// each kube-apiserver's --version runs once per test process.
var checked sync.Map

// checkBinaries checks that dir holds etcd and kube-apiserver, and that
// kube-apiserver is version v (a folder of another version would run the
// tests of v against the wrong server, under v's name).
func checkBinaries(dir, v string) error {
	if _, ok := checked.Load(dir + "\x00" + v); ok {
		return nil
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		p := filepath.Join(dir, b)
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("testenv: %s for Kubernetes %s not found at %s (set by $%s or its default): run `make testenv-bins` (builds etcd %s and kube-apiserver %s and %s from tools/ and tools/k8s-v1.35/)",
				b, v, p, binDirEnv[v], EtcdVersion, K8sVersion, K8sVersionPrev)
		}
	}
	p := filepath.Join(dir, "kube-apiserver")
	out, err := exec.Command(p, "--version").Output()
	if err != nil {
		return fmt.Errorf("testenv: %s --version: %w: run `make testenv-bins`", p, err)
	}
	if got := strings.TrimSpace(string(out)); got != "Kubernetes "+v {
		return fmt.Errorf("testenv: %s --version says %q, want \"Kubernetes %s\": $%s points at another version; run `make testenv-bins`",
			p, got, v, binDirEnv[v])
	}
	checked.Store(dir+"\x00"+v, true)
	return nil
}

// Start starts etcd and kube-apiserver of opts.Version and waits until both
// are ready. On error everything already started is stopped.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	version := opts.Version
	if version == "" {
		version = K8sVersion
	}
	bin, err := BinDirOf(version)
	if err != nil {
		return nil, err
	}
	if err := checkBinaries(bin, version); err != nil {
		return nil, err
	}
	e := &Env{opts: opts, version: version, binDir: bin, dir: opts.Dir}
	if e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "relayd-testenv-"); err != nil {
			return nil, err
		}
		e.ownsDir = true
	}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	if err := e.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := e.writeAPIServerFiles(); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	e.apiPort = port
	e.apiArgs = e.apiServerArgs()
	if err := e.startAPIServer(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// Version is the Kubernetes version e runs.
func (e *Env) Version() string { return e.version }

// Sibling returns a running Env of Kubernetes version v with e's Options
// (its own etcd, ports and temp dir): e itself when e runs v, otherwise one
// started at the first call for v, returned again by later calls, and
// stopped by e.Stop. A test package thus shares one Env per version, e.g.
// the one testenv.Main started and env.Sibling(ctx, testenv.K8sVersionPrev).
func (e *Env) Sibling(ctx context.Context, v string) (*Env, error) {
	if v == e.version {
		return e, nil
	}
	e.siblingsMu.Lock()
	defer e.siblingsMu.Unlock()
	if s := e.siblings[v]; s != nil {
		return s, nil
	}
	o := e.opts
	o.Version, o.Dir = v, ""
	s, err := Start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("testenv: starting the Kubernetes %s sibling of the %s env: %w", v, e.version, err)
	}
	if e.siblings == nil {
		e.siblings = map[string]*Env{}
	}
	e.siblings[v] = s
	return s, nil
}

// SiblingT is Sibling for a test: it fails tb on error.
func (e *Env) SiblingT(tb testing.TB, v string) *Env {
	tb.Helper()
	s, err := e.Sibling(tb.Context(), v)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func (e *Env) logf(format string, args ...any) {
	if e.opts.Logf != nil {
		e.opts.Logf(format, args...)
	}
}

func (e *Env) startEtcd(ctx context.Context) error {
	var lastErr error
	// A free port can be taken between freePort and the child's bind; retry.
	for attempt := 0; attempt < 3; attempt++ {
		client, err := freePort()
		if err != nil {
			return err
		}
		peer, err := freePort()
		if err != nil {
			return err
		}
		e.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", client)
		e.etcdPeer = peer
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
		dataDir := filepath.Join(e.dir, "etcd-data")
		_ = os.RemoveAll(dataDir)
		args := []string{
			"--name", "testenv", "--data-dir", dataDir,
			"--listen-client-urls", e.etcdURL, "--advertise-client-urls", e.etcdURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "testenv=" + peerURL,
			"--unsafe-no-fsync", "--log-level", "warn",
		}
		p, err := startProc(filepath.Join(e.binDir, "etcd"), args, filepath.Join(e.dir, "etcd.log"))
		if err != nil {
			return err
		}
		e.etcd = p
		t0 := time.Now()
		if lastErr = waitHTTP(ctx, p, e.etcdURL+"/health", nil, 30*time.Second); lastErr == nil {
			e.logf("testenv: etcd ready at %s in %v", e.etcdURL, time.Since(t0).Round(time.Millisecond))
			return nil
		}
		p.kill()
		e.etcd = nil
	}
	return fmt.Errorf("testenv: etcd did not become healthy: %w (log: %s)", lastErr, filepath.Join(e.dir, "etcd.log"))
}

func (e *Env) writeAPIServerFiles() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	tokens := fmt.Sprintf("%s,%s,%s-uid,\"system:masters\"\n%s,%s,%s-uid\n",
		adminToken, AdminUser, AdminUser, restrictedToken, RestrictedUser, RestrictedUser)
	for name, data := range map[string][]byte{"sa.key": priv, "sa.pub": pub, "tokens.csv": []byte(tokens)} {
		if err := os.WriteFile(filepath.Join(e.dir, name), data, 0o600); err != nil {
			return err
		}
	}
	e.caFile = filepath.Join(e.dir, "certs", "apiserver.crt")
	if e.opts.AuditLog {
		return e.writeAuditPolicy()
	}
	return nil
}

func (e *Env) apiServerArgs() []string {
	args := []string{
		"--etcd-servers=" + e.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		fmt.Sprintf("--secure-port=%d", e.apiPort), "--cert-dir=" + filepath.Join(e.dir, "certs"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(e.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(e.dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--token-auth-file=" + filepath.Join(e.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		// Compaction only when a test asks for it (CompactNow), for determinism.
		"--etcd-compaction-interval=0",
	}
	if e.opts.DisableWatchCache {
		args = append(args, "--watch-cache=false")
	}
	if e.opts.AuditLog {
		args = append(args, e.auditArgs()...)
	}
	return append(args, e.opts.ExtraAPIServerArgs...)
}

func (e *Env) startAPIServer(ctx context.Context) error {
	logFile := filepath.Join(e.dir, fmt.Sprintf("apiserver.%d.log", e.restartCnt))
	p, err := startProc(filepath.Join(e.binDir, "kube-apiserver"), e.apiArgs, logFile)
	if err != nil {
		return err
	}
	e.apiserver = p
	t0 := time.Now()
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", e.apiPort)
	if err := waitHTTP(ctx, p, url, insecureClient(), 90*time.Second); err != nil {
		return fmt.Errorf("testenv: kube-apiserver not ready: %w (log: %s)", err, logFile)
	}
	e.logf("testenv: kube-apiserver ready at https://127.0.0.1:%d in %v", e.apiPort, time.Since(t0).Round(time.Millisecond))
	return nil
}

// RestartAPIServer stops kube-apiserver (SIGTERM) and starts it again on the
// same port, certificates and etcd. With the watch cache on, any
// resourceVersion older than the new cache's start then gets 410 Expired.
func (e *Env) RestartAPIServer(ctx context.Context) error {
	if e.apiserver != nil {
		e.apiserver.stop(15 * time.Second)
	}
	e.restartCnt++
	return e.startAPIServer(ctx)
}

// StopAPIServer stops kube-apiserver (for outage tests); StartAPIServer
// brings it back on the same port.
func (e *Env) StopAPIServer() {
	if e.apiserver != nil {
		e.apiserver.stop(15 * time.Second)
		e.apiserver = nil
	}
}

// StartAPIServer starts a stopped kube-apiserver again.
func (e *Env) StartAPIServer(ctx context.Context) error {
	if e.apiserver != nil {
		return errors.New("testenv: kube-apiserver is already running")
	}
	e.restartCnt++
	return e.startAPIServer(ctx)
}

// Host is the apiserver URL.
func (e *Env) Host() string { return fmt.Sprintf("https://127.0.0.1:%d", e.apiPort) }

// EtcdEndpoint is etcd's client URL.
func (e *Env) EtcdEndpoint() string { return e.etcdURL }

// Dir is the working directory (logs, certificates, data).
func (e *Env) Dir() string { return e.dir }

// AdminConfig is a *rest.Config for a system:masters identity.
func (e *Env) AdminConfig() *rest.Config { return e.config(adminToken) }

// AdminToken is the bearer token of the system:masters identity (for
// clients other than client-go, such as curl in `make sandbox`).
func (e *Env) AdminToken() string { return adminToken }

// RestrictedConfig is a *rest.Config for the user "relayd", which has no
// permissions until a test binds a role to it.
func (e *Env) RestrictedConfig() *rest.Config { return e.config(restrictedToken) }

func (e *Env) config(token string) *rest.Config {
	return &rest.Config{
		Host:            e.Host(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: e.caFile},
		QPS:             -1, // no client-side rate limit in tests
	}
}

// WriteKubeconfig writes a kubeconfig for the admin (restricted=false) or the
// restricted identity, for child processes such as relayd itself.
func (e *Env) WriteKubeconfig(path string, restricted bool) error {
	token, user := adminToken, AdminUser
	if restricted {
		token, user = restrictedToken, RestrictedUser
	}
	return WriteKubeconfigToken(path, e.Host(), e.caFile, user, token)
}

// WriteKubeconfigToken writes a kubeconfig for the apiserver at host with a
// bearer token (a token-file identity or a ServiceAccount token).
func WriteKubeconfigToken(path, host, caFile, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: host, CertificateAuthority: caFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: user}
	cfg.CurrentContext = "testenv"
	return clientcmd.WriteToFile(*cfg, path)
}

// CAFile is the apiserver's serving certificate, to trust in clients.
func (e *Env) CAFile() string { return e.caFile }

// Stop kills kube-apiserver and etcd (SIGTERM, then SIGKILL) and removes the
// working directory if testenv created it, and does the same for every
// Sibling. Safe to call more than once.
func (e *Env) Stop() {
	e.siblingsMu.Lock()
	for v, s := range e.siblings {
		s.Stop()
		delete(e.siblings, v)
	}
	e.siblingsMu.Unlock()
	if e.apiserver != nil {
		e.apiserver.stop(10 * time.Second)
		e.apiserver = nil
	}
	if e.etcd != nil {
		e.etcd.stop(10 * time.Second)
		e.etcd = nil
	}
	if e.ownsDir && e.dir != "" && os.Getenv("RELAYD_TESTENV_KEEP") == "" {
		_ = os.RemoveAll(e.dir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
