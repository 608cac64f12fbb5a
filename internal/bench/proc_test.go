package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary the memory helper of
// TestPeakRSSOfChild instead of running tests.
const helperEnv = "RELAYD_BENCH_MEM_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		memoryHelper()
		os.Exit(0)
	}
	if os.Getenv(selfEnv) == "1" && len(os.Args) > 1 {
		os.Exit(self(os.Args[1], os.Args[2:]))
	}
	os.Exit(m.Run())
}

// memoryHelper reads commands from stdin and answers each with a line:
// "spike N" maps N MiB, writes every page and unmaps them again (a
// transient peak no RSS sampling is sure to see); "hold N" maps and writes
// N MiB and keeps them.
func memoryHelper() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(arg)
		if err != nil {
			fmt.Println("error", err)
			continue
		}
		b, err := syscall.Mmap(-1, 0, n<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			fmt.Println("error", err)
			continue
		}
		for i := 0; i < len(b); i += os.Getpagesize() {
			b[i] = 1
		}
		if cmd != "hold" { // a held mapping stays until the process exits
			err = syscall.Munmap(b)
		}
		if err != nil {
			fmt.Println("error", err)
			continue
		}
		fmt.Println("ok", cmd, n)
	}
}

// The relist peak of the memory scenario is the kernel's VmHWM after a
// reset through /proc/<pid>/clear_refs: exercised on a real child process
// whose RSS rises and falls.
func TestPeakRSSOfChild(t *testing.T) {
	c, err := StartChild("memhelper", os.Args[0], nil,
		[]string{helperEnv + "=1"}, filepath.Join(t.TempDir(), "memhelper.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(10 * time.Second)
	do := func(cmd string) {
		t.Helper()
		if _, err := fmt.Fprintln(c.stdin, cmd); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitLine(t.Context(), "ok "+cmd, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	const mib = 1 << 20
	do("hold 16")
	do("spike 128")
	rss, hwm, err := c.Mem()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after a 128 MiB spike: VmRSS %d kB, VmHWM %d kB", rss>>10, hwm>>10)
	if hwm < rss+100*mib {
		t.Fatalf("VmHWM %d kB does not hold the 128 MiB spike above VmRSS %d kB", hwm>>10, rss>>10)
	}

	reset, err := c.ResetPeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reset: VmHWM %d kB → %d kB (VmRSS %d kB)", reset.HWMBefore>>10, reset.HWMAfter>>10, reset.RSSAfter>>10)
	if reset.HWMBefore != hwm || reset.HWMAfter > reset.RSSAfter+hwmResetSlack || reset.HWMAfter > hwm-100*mib {
		t.Fatalf("reset %+v after VmHWM %d: want VmHWM back at VmRSS, 128 MiB below the old peak", reset, hwm)
	}

	do("spike 48")
	rss2, hwm2, err := c.Mem()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after a 48 MiB spike: VmRSS %d kB, VmHWM %d kB", rss2>>10, hwm2>>10)
	if hwm2 < reset.RSSAfter+40*mib || hwm2 > reset.RSSAfter+80*mib {
		t.Errorf("VmHWM %d kB after a 48 MiB spike from VmRSS %d kB: want the spike, not the earlier 128 MiB", hwm2>>10, reset.RSSAfter>>10)
	}
}
