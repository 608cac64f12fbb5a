// Package deploy holds the tests of relayd's shipped deployment artefacts:
// the kustomize base (deploy/base), its overlays (deploy/overlays: example,
// ha, nats-secure), the Dockerfile and .dockerignore, and the NATS
// permission blocks of docs/DEPLOY.md (relayd's, its JWT form, without
// create rights, and a consumer's), each run against a real nats-server.
//
// The manifests are rendered with the real kustomize (pinned in
// tools/kustomize, built by `make kustomize-bin`) and applied to a real
// kube-apiserver (internal/testenv). The RBAC is proven, not assumed: the
// real relayd binary (`make build`) runs as the rendered ServiceAccount with
// a token from the TokenRequest API, becomes ready, relays a change of every
// watched kind to a real NATS JetStream and writes its checkpoint. Then every
// single permission of the rendered Role and ClusterRole is taken away in
// turn, and relayd must report exactly that permission (verb and resource)
// in its log, stay unready, and keep /healthz up. "list" is proven on a
// second apiserver with streaming lists turned off (on one that serves them,
// a snapshot start is authorized as "watch" alone); relayd's forbidden LIST
// is accepted in a weaker form until it keeps the apiserver's reason (see
// requireAPIServerTextForList).
//
// The static checks pin what the cluster cannot: no wildcards, no create, no
// secrets, the ClusterRole equal to what the shipped config watches, the
// restricted securityContext, and the Dockerfile building with the
// Makefile's flags and starting the way the Deployment expects.
package deploy
