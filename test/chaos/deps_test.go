package chaos

// The scenarios run a relayd binary that the test builds with `go build`
// at run time, a dependency Go's test cache cannot see: without these
// imports, `go test ./...` would report a cached pass after a change to
// relayd's data path. (A change to cmd/relayd itself or to the failpoint
// build of internal/failpoint still needs -count=1.)
import (
	_ "github.com/relayd/relayd/internal/failpoint"
	_ "github.com/relayd/relayd/pkg/relay"
)
