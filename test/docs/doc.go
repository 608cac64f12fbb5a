// Package docs holds the tests that keep README.md and docs/*.md agreeing
// with the code on the facts that drift: the CloudEvents extension names
// (pkg/event), the subject grammar and its token counts (pkg/event's
// encoder and ParseSubject, driven by the examples in docs/CONSUMING.md),
// the relayd_* metric names (pkg/metrics' registry) and the config key
// paths (pkg/config). Every name is read from the code, never from a list
// kept here, so a new metric or extension needs only its documentation.
// They read files and build in-process values only: no server is started.
package docs
