// Package client dials the runtime daemon's socket: the only way the node's
// provider reaches the runtime (api/runtime/v1 over gRPC on a unix socket).
package client

import (
	"context"
	"fmt"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	runtimev1 "github.com/k3sm-dev/k3sm/api/runtime/v1"
)

// Client holds both services of the contract on one connection.
type Client struct {
	Conn    *grpc.ClientConn
	Runtime runtimev1.RuntimeClient
	Images  runtimev1.ImagesClient
}

// Dial connects to the daemon's unix socket. The connection is lazy: the
// first call fails with codes.Unavailable while the daemon is down, and
// gRPC reconnects when it is back.
func Dial(socket string, opts ...grpc.DialOption) (*Client, error) {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, err
	}
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient("unix://"+abs, opts...)
	if err != nil {
		return nil, fmt.Errorf("runtime socket %s: %w", socket, err)
	}
	return &Client{Conn: conn, Runtime: runtimev1.NewRuntimeClient(conn), Images: runtimev1.NewImagesClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.Conn.Close() }

// WaitReady blocks until the daemon answers GetRuntimeInfo or ctx ends.
func (c *Client) WaitReady(ctx context.Context) (*runtimev1.GetRuntimeInfoResponse, error) {
	return c.Runtime.GetRuntimeInfo(ctx, &runtimev1.GetRuntimeInfoRequest{}, grpc.WaitForReady(true))
}
