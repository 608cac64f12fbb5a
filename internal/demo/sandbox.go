package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// keepRunning is the sandbox's main loop: it prints how to reach the
// servers and what to try, then waits for Ctrl-C (ctx) or for relayd or
// tail to exit on their own (an error).
func (d *demo) keepRunning(ctx context.Context, cfg string) error {
	kubeconfig := filepath.Join(d.tmp, "kubeconfig")
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	d.out.banner("sandbox ready")
	d.out.line("", fmt.Sprintf(`  KUBECONFIG   %[1]s
  NATS         %[2]s (stream K8S, subjects k8s.demo.>)
  relayd       config %[3]s, log lines start with [relayd]

Try, in another terminal (from %[4]s):

  # 1. create an object relayd watches (ConfigMaps labelled app=shop in namespace demo):
  curl -sS --cacert %[5]s -H 'Authorization: Bearer %[6]s' -H 'Content-Type: application/json' \
    %[7]s/api/v1/namespaces/demo/configmaps -d '{"metadata":{"name":"try-me","labels":{"app":"shop"}},"data":{"k":"v"}}'
  #    (or, with kubectl: kubectl --kubeconfig %[1]s -n demo create configmap try-me --from-literal=k=v
  #     && kubectl --kubeconfig %[1]s -n demo label configmap try-me app=shop)

  # 2. see what relayd published, from the stream's start:
  %[8]s tail -c %[3]s --replay

  # 3. run the example consumer (docs/CONSUMING.md): it keeps a view of the objects
  go run ./examples/consumer --server %[2]s --stream K8S --cluster demo --kubeconfig %[1]s

Ctrl-C here stops everything and removes %[9]s.`,
		kubeconfig, d.nats.URL(), cfg, root, d.env.CAFile(), d.env.AdminToken(), d.env.Host(), d.bin, d.tmp))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := d.childrenUp(); err != nil {
				return err
			}
		}
	}
}
