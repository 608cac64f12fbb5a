package event_test

import (
	"fmt"

	"github.com/relayd/relayd/pkg/event"
)

func ExampleNewShaping() {
	s, err := event.NewShaping(event.ShapingOptions{
		Drop:          []string{"spec.containers[*].env", `metadata.annotations["example.com/token"]`},
		IgnoreChanges: []string{"status"},
	})
	if err != nil {
		panic(err)
	}
	frame := []byte(`{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Pod",` +
		`"metadata":{"name":"web","resourceVersion":"7","annotations":{"example.com/token":"s3cr3t","team":"a"}},` +
		`"spec":{"containers":[{"name":"app","env":[{"name":"PASSWORD","value":"hunter2"}]}]},` +
		`"status":{"phase":"Running"}}}`)
	_, o, err := event.ParseWatchEventShaped(frame, s)
	if err != nil {
		panic(err)
	}
	data, dropped := o.AppendShaped(nil, event.PayloadFull, s)
	fmt.Println(string(data))
	fmt.Println(dropped)

	// A new status alone leaves the fingerprint as it was.
	later := []byte(`{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Pod",` +
		`"metadata":{"name":"web","resourceVersion":"8","annotations":{"example.com/token":"s3cr3t","team":"a"}},` +
		`"spec":{"containers":[{"name":"app","env":[{"name":"PASSWORD","value":"hunter2"}]}]},` +
		`"status":{"phase":"Succeeded"}}}`)
	_, o2, _ := event.ParseWatchEventShaped(later, s)
	fmt.Println(o.Fingerprint(s) == o2.Fingerprint(s))
	// Output:
	// {"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","resourceVersion":"7","annotations":{"team":"a"}},"spec":{"containers":[{"name":"app"}]},"status":{"phase":"Running"}}
	// [spec.containers[*].env metadata.annotations["example.com/token"]]
	// true
}

func ExampleParsePath() {
	for _, s := range []string{
		"spec.template.spec.containers[*].env",
		`metadata.annotations["example.com/token"]`,
		`["spec"]["replicas"]`,
		"spec.ports[0]",
		"metadata.annotations.example.com/token",
	} {
		p, err := event.ParsePath(s)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(p)
	}
	// Output:
	// spec.template.spec.containers[*].env
	// metadata.annotations["example.com/token"]
	// spec.replicas
	// error: [N] indexes are not supported (use [*]) at offset 10
	// error: unexpected "/" at offset 32 (write member names with characters other than letters, digits, '_' and '-' as ["..."])
}
