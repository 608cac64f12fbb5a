//go:build failpoints

package failpoint

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Enabled reports whether the binary was built with failpoints.
const Enabled = true

// EnvVar configures the failpoints.
const EnvVar = "RELAYD_FAILPOINTS"

type point struct {
	action string
	sleep  time.Duration
	n      int64   // fire on this hit only; 0 = not set
	p      float64 // fire with this probability; 0 = not set
	hits   int64
}

var (
	once   sync.Once
	mu     sync.Mutex
	points map[string]*point
)

func load() {
	points = map[string]*point{}
	spec := os.Getenv(EnvVar)
	if spec == "" {
		return
	}
	for _, item := range strings.Split(spec, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, rest, ok := strings.Cut(item, "=")
		if !ok {
			panic(fmt.Sprintf("%s: %q: want name=action", EnvVar, item))
		}
		parts := strings.Split(rest, ",")
		pt := &point{action: parts[0]}
		if d, ok := strings.CutPrefix(pt.action, "sleep:"); ok {
			var err error
			if pt.sleep, err = time.ParseDuration(d); err != nil {
				panic(fmt.Sprintf("%s: %q: %v", EnvVar, item, err))
			}
			pt.action = "sleep"
		}
		switch pt.action {
		case "kill", "panic", "sleep":
		default:
			panic(fmt.Sprintf("%s: %q: unknown action %q", EnvVar, item, pt.action))
		}
		for _, kv := range parts[1:] {
			k, v, _ := strings.Cut(kv, "=")
			var err error
			switch k {
			case "n":
				pt.n, err = strconv.ParseInt(v, 10, 64)
			case "p":
				pt.p, err = strconv.ParseFloat(v, 64)
			default:
				err = fmt.Errorf("unknown option %q", k)
			}
			if err != nil {
				panic(fmt.Sprintf("%s: %q: %v", EnvVar, item, err))
			}
		}
		known := false
		for _, p := range Points {
			known = known || p == name
		}
		if !known {
			panic(fmt.Sprintf("%s: unknown failpoint %q (known: %s)", EnvVar, name, strings.Join(Points, ", ")))
		}
		points[name] = pt
	}
}

// Inject fires the failpoint name if RELAYD_FAILPOINTS arms it.
func Inject(name string) {
	once.Do(load)
	mu.Lock()
	pt := points[name]
	fire := false
	var hits int64
	if pt != nil {
		pt.hits++
		hits = pt.hits // read under mu: another watch may hit the point meanwhile
		switch {
		case pt.n > 0:
			fire = pt.hits == pt.n
		case pt.p > 0:
			fire = rand.Float64() < pt.p
		default:
			fire = true
		}
	}
	mu.Unlock()
	if !fire {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s: %s (hit %d)\n", name, pt.action, hits)
	switch pt.action {
	case "kill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	case "panic":
		panic("failpoint " + name)
	case "sleep":
		time.Sleep(pt.sleep)
	}
}
