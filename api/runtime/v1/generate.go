// Package runtimev1 is the k3sm runtime contract (package k3sm.runtime.v1):
// the gRPC services the node's provider uses to run pods through the runtime
// daemon. The .pb.go files are generated from runtime.proto and committed.
//
// Regenerate with `go generate ./api/runtime/v1` (needs protoc and
// protoc-gen-go v1.36.12 and protoc-gen-go-grpc v1.6.2 on PATH):
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
package runtimev1

//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative runtime.proto
