// Command relayd relays Kubernetes changes to NATS JetStream.
//
// main only parses the command line, builds the logger and the signal
// context, and hands over to the packages that do the work.
package main

import (
	"fmt"
	"os"

	"github.com/relayd/relayd/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return 2
	}
	switch args[0] {
	case "version":
		fmt.Println(version.String())
		return 0
	case "-h", "--help", "help":
		usage()
		return 0
	default:
		fmt.Fprintf(os.Stderr, "relayd: unknown command %q\n", args[0])
		usage()
		return 2
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `Usage: relayd <command> [flags]

Commands:
  version        print the version
`)
}
