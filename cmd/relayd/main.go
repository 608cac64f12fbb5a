// Command relayd relays Kubernetes changes to NATS JetStream.
//
// main only parses the command line, builds the logger and the signal
// context, and hands over to the packages that do the work.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/relayd/relayd/internal/version"
	"github.com/relayd/relayd/pkg/config"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// The exit codes of every command (docs/OPERATIONS.md "Exit codes").
const (
	exitOK      = 0 // success; check-config: every file is valid
	exitFailure = 1 // runtime error, or an invalid or unreadable config file
	exitUsage   = 2 // unknown command or flag, bad flag value or environment
)

const usage = `Usage: relayd <command> [flags]

relayd relays the changes of Kubernetes objects to NATS JetStream as
CloudEvents.

Commands:
  run            run the relay
  check-config   validate config files
  tail           print relayd's events from NATS as they arrive
  resync         ask the running relayd to relist a source
  version        print the version
  help           print this help, or a command's: relayd help run

Run "relayd <command> --help" for a command's flags and examples.

Examples:
  relayd check-config -c config.yaml
  relayd run -c config.yaml --kubeconfig ~/.kube/config --context kind-dev
  relayd tail -c config.yaml --count 10

Exit codes:
  0  success (check-config: every file is valid)
  1  runtime error: run stopped on an error or found its config invalid or
     unreadable; check-config found a file invalid or unreadable; tail could
     not connect or read; resync was not answered, refused or not completed
  2  usage error: unknown command or flag, a bad flag value, a bad
     NATS_URL/NATS_CREDS/NATS_CONTEXT (tail), or a source not in the config
     (resync); nothing was started
`

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "check-config":
		return cmdCheckConfig(args[1:], stdin, stdout, stderr)
	case "tail":
		return cmdTail(args[1:], stdout, stderr)
	case "resync":
		return cmdResync(args[1:], stdout, stderr)
	case "version", "--version":
		return cmdVersion(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		if len(args) > 1 && args[0] == "help" {
			return run([]string{args[1], "--help"}, stdin, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "relayd: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	c := newCommand("version", "relayd version", "Print relayd's version (and whether it was built with failpoints).", "  relayd version")
	if done, code := c.parse(args, stdout, stderr); done {
		return code
	}
	if c.fs.NArg() > 0 {
		return c.usageError(stderr, "unexpected argument %q", c.fs.Arg(0))
	}
	fmt.Fprintln(stdout, version.String())
	return exitOK
}

func cmdCheckConfig(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := newCommand("check-config", "relayd check-config -c FILE [-c FILE ...]", `
Validate config files without connecting to anything: every problem of
each file is printed with its file, line and key, and so are the warnings
(credentials accepted without TLS, file settings given as relative paths).
"-c -" reads a config from standard input. The exit code is 0 when every
file is valid, 1 when one is not (or cannot be read), 2 on a usage error.`, `
  relayd check-config -c config.yaml
  relayd check-config -c base.yaml -c prod.yaml
  kubectl get cm relayd -o jsonpath='{.data.config\.yaml}' | relayd check-config -c -`)
	files := c.fs.StringArrayP("config", "c", nil, `config file to check (repeatable; "-" reads standard input)`)
	if done, code := c.parse(args, stdout, stderr); done {
		return code
	}
	paths := append(*files, c.fs.Args()...)
	if len(paths) == 0 {
		return c.usageError(stderr, "no file given (-c FILE)")
	}
	if !config.Check(stdout, stdin, paths...) {
		return exitFailure
	}
	return exitOK
}
