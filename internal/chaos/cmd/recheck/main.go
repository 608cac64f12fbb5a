// Command recheck re-checks histories written by failed chaos runs:
//
//	go run ./internal/chaos/cmd/recheck [-all] history-*.json
//
// It prints each report and exits 1 if any history fails.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/relayd/relayd/internal/chaos/history"
)

func main() {
	all := flag.Bool("all", false, "list every failure (the summary lists 20)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: recheck [-all] history.json...")
		os.Exit(2)
	}
	code := 0
	for _, p := range flag.Args() {
		h, err := history.Load(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
			continue
		}
		r := history.Check(h)
		fmt.Printf("%s (%s, seed %d): %s\n", p, h.Scenario, h.Seed, r.Summary())
		if *all {
			for _, f := range r.Failures {
				fmt.Println("  " + f.String())
			}
		}
		if !r.OK() {
			code = 1
		}
	}
	os.Exit(code)
}
