package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// command is one subcommand: its flags (GNU style, --long and -c, parsed
// by spf13/pflag) and its help, printed on stdout for --help.
type command struct {
	name     string
	synopsis string // "relayd run [flags]"
	about    string // what it does, a paragraph or more
	examples string // one example a line
	after    string // text after the examples, or ""
	fs       *pflag.FlagSet
	help     bool
}

func newCommand(name, synopsis, about, examples string) *command {
	c := &command{name: name, synopsis: synopsis, about: about, examples: examples}
	c.fs = pflag.NewFlagSet(name, pflag.ContinueOnError)
	c.fs.SortFlags = false
	c.fs.SetOutput(io.Discard) // parse reports errors itself
	c.fs.Usage = func() {}
	return c
}

// usage is the command's help text.
func (c *command) usage() string {
	c.addHelp()
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s\n\n%s\n", c.synopsis, strings.TrimSpace(c.about))
	if flags := c.fs.FlagUsages(); flags != "" {
		fmt.Fprintf(&b, "\nFlags:\n%s", flags)
	}
	if c.examples != "" {
		fmt.Fprintf(&b, "\nExamples:\n%s\n", strings.Trim(c.examples, "\n"))
	}
	if c.after != "" {
		fmt.Fprintf(&b, "\n%s\n", strings.TrimSpace(c.after))
	}
	return b.String()
}

// parse parses args. When it returns done, the command is over with that
// exit code: 0 after printing the help on stdout (--help, -h), 2 after a
// usage error on stderr.
func (c *command) parse(args []string, stdout, stderr io.Writer) (done bool, code int) {
	c.addHelp()
	err := c.fs.Parse(singleDashLong(c.fs, args))
	switch {
	case errors.Is(err, pflag.ErrHelp), err == nil && c.help:
		fmt.Fprint(stdout, c.usage())
		return true, 0
	case err != nil:
		return true, c.usageError(stderr, "%s", err)
	}
	return false, 0
}

// addHelp adds -h, --help after the command's own flags.
func (c *command) addHelp() {
	if c.fs.Lookup("help") == nil {
		c.fs.BoolVarP(&c.help, "help", "h", false, "print this help and exit")
	}
}

// usageError prints msg and where to find the usage on stderr, and
// returns 2, the exit code of a usage error.
func (c *command) usageError(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "relayd %s: %s\nRun 'relayd %s --help' for usage.\n", c.name, fmt.Sprintf(format, args...), c.name)
	return exitUsage
}

// singleDashLong accepts the Go flag package's -name for a long flag
// (-config, -log-level=debug), as relayd's flags were parsed before: it
// rewrites them to --name. Arguments after "--" are left alone.
func singleDashLong(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && len(a) > 2 {
			name, _, _ := strings.Cut(a[1:], "=")
			if len(name) > 1 && fs.Lookup(name) != nil {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return out
}
