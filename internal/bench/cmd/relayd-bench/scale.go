package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/relayd/relayd/internal/bench"
)

// scale runs the scale steps (docs/PERFORMANCE.md, "Scale"). -quick sets
// CI-sized defaults; a flag given explicitly wins over them.
func scale(args []string) int {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	var (
		relayd     = fs.String("relayd", "", "relayd binary to measure (default: relay.Run in-process in a child of this program)")
		quick      = fs.Bool("quick", false, "CI-sized smoke run: -objects 1000,5000,20000 -namespaces 1000 -watch-namespaces 1,100 -sources 20 -rate-start 250 -rate-max 2000 -rate-probe 4s -rate-hold 15s (a few minutes)")
		steps      = fs.String("steps", "tracked,namespaces,sources,rate", "steps to run")
		objects    = fs.String("objects", "10000,100000,1000000", "tracked sizes (replay server); the largest gets the restart and 410 steps")
		podShare   = fs.Float64("pod-share", 0.15, "share of the tracked objects that are recorded 9 KB pods (the rest: ConfigMaps)")
		namespaces = fs.Int("namespaces", 10000, "namespaces the tracked objects are spread over")
		watchNS    = fs.String("watch-namespaces", "1,100,5000,10000", "sizes of the per-namespace step (real kube-apiserver): namespaces listed by one source")
		sources    = fs.Int("sources", 200, "sources in one relayd (real kube-apiserver)")
		rateRepl   = fs.String("rate-replicas", "1,3", "rate step: the streams' replicas (1: the harness's nats-server; n: a cluster of n nats-servers)")
		rateStart  = fs.Float64("rate-start", 1000, "rate step: the search's first rate (events/s); it doubles while probes hold")
		rateMax    = fs.Float64("rate-max", 64000, "rate step: the search's ceiling (events/s)")
		rateProbe  = fs.Duration("rate-probe", 15*time.Second, "rate step: each probe of the search")
		rateHold   = fs.Duration("rate-hold", 5*time.Minute, "rate step: how long the found rate is held")
		podEvents  = fs.Int("template-pod-events", 1000, "pod events recorded for the pod template (the largest recorded pod)")
		cache      = fs.String("cache", ".cache/bench", "recordings are kept here")
		work       = fs.String("work", "", "configs, logs, NATS store (default: <cache>/scale)")
		out        = fs.String("out", "", "write the Markdown report here (default: <work>/results.md) and JSON next to it")
		profileW   = fs.Bool("profile-watches", false, "per-namespace step: run relayd in-process and write its heap and goroutine profiles at each size (<work>/profiles)")
		restartCPU = fs.Bool("restart-profile", false, "CPU profile of the restart at the largest size, start to steady state (relayd in-process; <work>/profiles/restart-<n>.cpu.pprof)")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		for name, v := range map[string]string{"objects": "1000,5000,20000", "namespaces": "1000", "watch-namespaces": "1,100", "sources": "20",
			"rate-start": "250", "rate-max": "2000", "rate-probe": "4s", "rate-hold": "15s"} {
			if !set[name] {
				_ = fs.Set(name, v)
			}
		}
	}
	objs, err := ints(*objects)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayd-bench: -objects:", err)
		return 2
	}
	wns, err := ints(*watchNS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayd-bench: -watch-namespaces:", err)
		return 2
	}
	repl, err := ints(*rateRepl)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayd-bench: -rate-replicas:", err)
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayd-bench:", err)
		return 1
	}
	if *work == "" {
		*work = filepath.Join(*cache, "scale")
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
	rep, err := bench.RunScale(ctx, bench.Options{
		Self: self, RelaydBin: *relayd, CacheDir: *cache, WorkDir: *work,
		Record: bench.RecordOptions{PodEvents: *podEvents, WidgetEvents: 5, Logf: logf}, Logf: logf,
	}, bench.ScaleOptions{
		Steps: strings.Split(*steps, ","), Objects: objs, PodShare: *podShare, Namespaces: *namespaces,
		WatchNamespaces: wns, Sources: *sources, Quick: *quick, ProfileWatches: *profileW, RestartProfile: *restartCPU,
		Rate: bench.RateOptions{Replicas: repl, Start: *rateStart, Max: *rateMax, Probe: *rateProbe, Hold: *rateHold},
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
