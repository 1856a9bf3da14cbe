// Package limiterpb is the generated Go code of the Limiter gRPC API (limiter.proto):
// the sidecar serves it, and the core calls it through shared/limiterclient.
package limiterpb

//go:generate protoc -I . --go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. limiter.proto
