package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Main runs a test package against one shared environment: it starts
// etcd + kube-apiserver into *env and, when nats is non-nil, an embedded
// nats-server into *nats; runs the tests; stops every server; and then fails
// the package if goroutines leaked. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m, testenv.Options{}, &env, &nats)) }
//
// Missing binaries are a failure naming `make testenv-bins`, never a skip.
func Main(m *testing.M, opts Options, env **Env, nats **NATS) int {
	flag.Parse() // testing.Verbose needs parsed flags; m.Run parses again harmlessly
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if opts.Logf == nil && testing.Verbose() {
		opts.Logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	}
	e, err := Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	*env = e
	if nats != nil {
		n, err := StartNATS(NATSOptions{})
		if err != nil {
			e.Stop()
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
		*nats = n
	}
	code := m.Run()
	if nats != nil && *nats != nil {
		(*nats).Shutdown()
	}
	e.Stop()
	if code == 0 {
		if err := goleak.Find(LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: goroutine leak after all tests:", err)
			return 1
		}
	}
	return code
}

// LeakOptions are the goleak options for relayd's test packages: goroutines
// started by libraries on first use that live for the whole process.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*Typed[...]).updateUnfinishedWorkLoop"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.BackoffUntilWithContext.func1"),
		// An embedded nats-server schedules a stream source's consumer
		// setup on a timer (time.AfterFunc) that Shutdown does not stop;
		// fired after the server stopped, it outlives the test for a
		// moment (seen about once in seven runs of pkg/index), as does the
		// goroutine that setup starts to wait for the consumer's creation
		// (its func3, waiting up to the server's source consumer timeout).
		// Both are the test's server's goroutines, never relayd's.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
	}
}

// StartT starts etcd and kube-apiserver for one test (e.g. with other
// Options than the package's shared Env) and stops them in t.Cleanup.
func StartT(tb testing.TB, o Options) *Env {
	tb.Helper()
	e, err := Start(tb.Context(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Stop)
	return e
}

// NATST starts an embedded nats-server for one test and shuts it down in
// t.Cleanup.
func NATST(tb testing.TB, o NATSOptions) *NATS {
	tb.Helper()
	n, err := StartNATS(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(n.Shutdown)
	return n
}
