package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/relay"
)

// The consumer modes. Each runs in its own process, started by the harness,
// so that its CPU time is its own.
const (
	// ModeDynamic is a bare client-go dynamic-client watch: every frame is
	// decoded into an *unstructured.Unstructured (maps), and the consumer
	// reads the object's identity from it.
	ModeDynamic = "dynamic"
	// ModeTyped is a bare typed (corev1.Pod) watch with client-go's JSON
	// decoder, reading the identity likewise. Pods only.
	ModeTyped = "typed"
	// ModeInformer lists (and watches) ConfigMaps with a client-go shared
	// informer and reports when it has synced.
	ModeInformer = "informer"
	// ModeRelayd runs relay.Run in-process, exactly as cmd/relayd does; used
	// when no relayd binary is given (the smoke test) and for CPU profiles.
	ModeRelayd = "relayd"
)

// untilStdinClosed returns a context that ends on SIGTERM/SIGINT or when
// the harness closes our stdin.
func untilStdinClosed() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	return ctx, func() { cancel(); stop() }
}

// Consume is the child process `relayd-bench consume`. It prints
// "watching", then "done <n>" after n object events ("synced <n> <ns>"
// for the informer), and exits when its stdin is closed.
func Consume(args []string) int {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	var (
		mode        = fs.String("mode", ModeDynamic, "dynamic, typed, informer or relayd")
		kubeconfig  = fs.String("kubeconfig", "", "kubeconfig")
		group       = fs.String("group", "", "API group of the watched resource")
		version     = fs.String("version", "v1", "API version of the watched resource")
		resource    = fs.String("resource", "pods", "watched resource")
		namespace   = fs.String("namespace", "", "namespace (\"\" = all)")
		rv          = fs.String("rv", "", "resourceVersion to watch from")
		count       = fs.Int("count", 0, "object events to count before printing done")
		cfgPath     = fs.String("config", "", "relayd: config file")
		metricsAddr = fs.String("metrics-bind-address", "", "relayd: /metrics address")
		healthAddr  = fs.String("health-probe-bind-address", "", "relayd: /healthz address")
		cpuProfile  = fs.String("cpuprofile", "", "write a CPU profile here: of the whole run, or until SIGUSR2 (then it prints \"cpuprofile\")")
		memProfile  = fs.String("memprofile", "", "on SIGUSR1: collect garbage, write a heap profile here and print \"heapprofile\"")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Println("error", err)
			return 1
		}
		var once sync.Once
		stopProfile := func() {
			once.Do(func() {
				pprof.StopCPUProfile()
				f.Close()
			})
		}
		defer stopProfile()
		usr2 := make(chan os.Signal, 1)
		signal.Notify(usr2, syscall.SIGUSR2)
		defer signal.Stop(usr2)
		go func() {
			<-usr2
			stopProfile()
			fmt.Println("cpuprofile", *cpuProfile)
		}()
	}
	ctx, cancel := untilStdinClosed()
	defer cancel()
	if *memProfile != "" {
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
		go func() {
			for {
				select {
				case <-usr1:
					if err := writeHeapProfile(*memProfile); err != nil {
						fmt.Println("error", err)
					} else {
						fmt.Println("heapprofile", *memProfile)
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	klog.SetLogger(zapr.NewLogger(zap.NewNop()))
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	cfg.QPS = -1
	gvr := schema.GroupVersionResource{Group: *group, Version: *version, Resource: *resource}
	switch *mode {
	case ModeDynamic, ModeTyped:
		err = watchCount(ctx, cfg, *mode, gvr, *namespace, *rv, *count)
	case ModeInformer:
		err = informerSync(ctx, cfg, *namespace)
	case ModeRelayd:
		err = runRelayd(ctx, cfg, *cfgPath, *metricsAddr, *healthAddr)
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Println("error", err)
		return 1
	}
	return 0
}

func writeHeapProfile(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// The goroutines next to it: their stacks are memory too.
	g, err := os.Create(strings.TrimSuffix(path, ".heap.pprof") + ".goroutine.pprof")
	if err != nil {
		return err
	}
	if err := pprof.Lookup("goroutine").WriteTo(g, 0); err != nil {
		g.Close()
		return err
	}
	return g.Close()
}

// identity is what every consumer reads from each object: no consumer can
// do less with an event than know which object and version it is.
type identity struct{ uid, ns, name, rv string }

func watchCount(ctx context.Context, cfg *rest.Config, mode string, gvr schema.GroupVersionResource, ns, rv string, count int) error {
	opts := metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: ptrTo(int64(3600))}
	var w watch.Interface
	switch mode {
	case ModeDynamic:
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return err
		}
		if w, err = dyn.Resource(gvr).Namespace(ns).Watch(ctx, opts); err != nil {
			return err
		}
	case ModeTyped:
		if gvr.Group != "" || gvr.Resource != "pods" {
			return errors.New("typed mode watches pods only")
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		if w, err = cs.CoreV1().Pods(ns).Watch(ctx, opts); err != nil {
			return err
		}
	}
	defer w.Stop()
	fmt.Println("watching")
	var last identity
	n := 0
	for n < count {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("watch closed after %d events", n)
			}
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				m, err := meta.Accessor(ev.Object)
				if err != nil {
					return err
				}
				last = identity{string(m.GetUID()), m.GetNamespace(), m.GetName(), m.GetResourceVersion()}
				n++
			case watch.Error:
				return fmt.Errorf("watch error after %d events: %v", n, ev.Object)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fmt.Printf("done %d %s\n", n, last.rv)
	<-ctx.Done()
	return nil
}

func informerSync(ctx context.Context, cfg *rest.Config, ns string) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().ConfigMaps().Informer()
	fmt.Println("start")
	t0 := time.Now()
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	n := 0
	for _, o := range inf.GetStore().List() {
		if _, ok := o.(*corev1.ConfigMap); ok {
			n++
		}
	}
	fmt.Printf("synced %d %d\n", n, time.Since(t0).Nanoseconds())
	<-ctx.Done()
	return nil
}

// runRelayd is cmd/relayd's `run`, with a warn-level JSON logger.
func runRelayd(ctx context.Context, rc *rest.Config, cfgPath, metricsAddr, healthAddr string) error {
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(zapcore.WarnLevel)
	log, err := zc.Build()
	if err != nil {
		return err
	}
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	rc.QPS = 0 // as cmd/relayd: client-go's defaults
	return relay.Run(ctx, relay.Options{
		Config: cfg, RestConfig: rc, Logger: log, Registry: prometheus.NewRegistry(),
		MetricsAddr: metricsAddr, HealthAddr: healthAddr,
	})
}

// NATSD is the child process `relayd-bench natsd`: a nats-server with
// JetStream (file storage in -store) on 127.0.0.1. It prints "ready <url>"
// and runs until its stdin is closed.
func NATSD(args []string) int {
	fs := flag.NewFlagSet("natsd", flag.ContinueOnError)
	store := fs.String("store", "", "JetStream store directory")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := untilStdinClosed()
	defer cancel()
	srv, err := server.NewServer(&server.Options{
		ServerName: "relayd-bench", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: *store, NoLog: true, NoSigs: true,
	})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		fmt.Println("error nats-server not ready")
		return 1
	}
	fmt.Println("ready", srv.ClientURL())
	<-ctx.Done()
	srv.Shutdown()
	srv.WaitForShutdown()
	return 0
}
