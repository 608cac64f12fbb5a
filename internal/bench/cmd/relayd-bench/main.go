// Command relayd-bench measures relayd next to bare client-go consumers of
// the same watch (docs/PERFORMANCE.md). `make bench` runs it.
//
//	relayd-bench run [flags]     the benchmark (see -h)
//	relayd-bench scale [flags]   the scale run (see -h)
//	relayd-bench consume ...     a consumer process (started by run)
//	relayd-bench natsd ...       the NATS server process (started by run)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/relayd/relayd/internal/bench"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: relayd-bench run|scale|consume|natsd [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "consume":
		os.Exit(bench.Consume(os.Args[2:]))
	case "natsd":
		os.Exit(bench.NATSD(os.Args[2:]))
	case "run":
		os.Exit(run(os.Args[2:]))
	case "scale":
		os.Exit(scale(os.Args[2:]))
	default:
		fmt.Fprintf(os.Stderr, "relayd-bench: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func run(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var (
		relayd    = fs.String("relayd", "", "relayd binary to measure (default: relay.Run in-process in a child of this program)")
		events    = fs.Int("events", 50000, "pod watch events to record and replay")
		crdEvents = fs.Int("crd-events", 20000, "custom-resource (Widget) watch events to record and replay")
		repeat    = fs.Int("repeat", 3, "repetitions of each capacity and recovery measurement")
		scenarios = fs.String("scenarios", "capacity,latency,memory,recovery", "scenarios to run")
		rate      = fs.Int("latency-rate", 100, "writes per second in the latency scenario (open loop, 16 writers)")
		latDur    = fs.Duration("latency-duration", 30*time.Second, "duration of the latency scenario's load")
		idle      = fs.Duration("idle", 60*time.Second, "how long to watch an idle relayd for checkpoint writes")
		memSizes  = fs.String("memory-objects", "10000,50000,100000", "object counts of the memory scenario")
		churn     = fs.Int("memory-churn", 20000, "MODIFIED events replayed after the list in the memory scenario")
		recovery  = fs.Int("recovery-objects", 10000, "objects relisted after the forced 410")
		cache     = fs.String("cache", ".cache/bench", "recordings are kept here")
		work      = fs.String("work", "", "configs, logs, NATS store, profiles (default: <cache>/run)")
		out       = fs.String("out", "", "write the Markdown report here (default: <work>/results.md) and JSON next to it")
		profile   = fs.Bool("profile", false, "also take CPU profiles of the capacity consumers (into <work>/profiles)")
		consumers = fs.String("consumers", "", "capacity consumers to run, comma-separated (relayd, relayd-shaped, relayd-filtered, relayd-metadata, relayd-metadata-whole, dynamic, typed; default all)")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var consumerList []string
	if *consumers != "" {
		consumerList = strings.Split(*consumers, ",")
	}
	sizes, err := ints(*memSizes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayd-bench: -memory-objects:", err)
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayd-bench:", err)
		return 1
	}
	if *work == "" {
		*work = filepath.Join(*cache, "run")
	}
	_ = os.RemoveAll(*work)
	if *out == "" {
		*out = filepath.Join(*work, "results.md")
	}
	if *relayd != "" {
		if *relayd, err = filepath.Abs(*relayd); err != nil {
			fmt.Fprintln(os.Stderr, "relayd-bench:", err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+f+"\n", a...) }
	rep, err := bench.Run(ctx, bench.Options{
		Self: self, RelaydBin: *relayd, CacheDir: *cache, WorkDir: *work,
		Record: bench.RecordOptions{PodEvents: *events, WidgetEvents: *crdEvents, Logf: logf},
		Repeat: *repeat, Scenarios: strings.Split(*scenarios, ","), Consumers: consumerList,
		LatencyRate: *rate, LatencyDuration: *latDur, IdleFor: *idle,
		MemSizes: sizes, MemChurn: *churn, RecoveryObjects: *recovery,
		Profile: *profile, Logf: logf,
	})
	if rep != nil {
		f, ferr := os.Create(*out)
		if ferr == nil {
			rep.Markdown(f)
			f.Close()
			_ = rep.WriteJSON(strings.TrimSuffix(*out, filepath.Ext(*out)) + ".json")
		}
		fmt.Println()
		rep.Markdown(os.Stdout)
		fmt.Printf("(report: %s; logs: %s)\n", *out, filepath.Join(*work, "logs"))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayd-bench:", err)
		return 1
	}
	return 0
}
