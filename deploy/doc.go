// Package deploy holds what runs the system beyond one machine — the Dockerfile (here),
// docker-compose.yml (at the repository root), the Kubernetes manifests and the systemd
// units — and the tests that hold them to the binaries: every variable they set is one
// the program reads, keys and files they name exist, ports agree with Envoy's config,
// probe paths are served, images are pinned. No Docker engine or cluster is needed.
package deploy
