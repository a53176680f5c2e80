// Package docker owns what klimax creates in a Docker engine, through the
// Engine API client: the shared kind bridge network, the pull-through
// registry mirror containers, and the host-side Docker settings that reach
// the engine (docker-env lines and a Docker CLI context).
package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Labels klimax puts on everything it creates, so status, down and destroy
// act only on klimax's own objects.
const (
	LabelManagedBy = "managed-by"
	ManagedBy      = "klimax"
	LabelMirror    = "klimax.dev/mirror"
	LabelSpecHash  = "klimax.dev/spec-hash"
	LabelNetwork   = "klimax.dev/network"
)

// Client talks to one Docker engine.
type Client struct {
	api  *client.Client
	host string
}

// New connects to the engine at dockerHost (e.g. unix:///Users/me/.klimax.docker.sock);
// "" uses DOCKER_HOST and the client's defaults. The API version is
// negotiated, so older engines (API >= 1.40) work.
func New(dockerHost string) (*Client, error) {
	opts := []client.Opt{client.FromEnv}
	if dockerHost != "" {
		opts = append(opts, client.WithHost(dockerHost))
	}
	c, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client for %q: %w", dockerHost, err)
	}
	return &Client{api: c, host: dockerHost}, nil
}

// Close releases the client's connections.
func (c *Client) Close() error { return c.api.Close() }

// API exposes the underlying Engine API client (for tests and K1's cluster code).
func (c *Client) API() *client.Client { return c.api }

// Ping checks that the engine answers and returns its version.
func (c *Client) Ping(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	v, err := c.api.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		where := c.host
		if where == "" {
			where = "the default Docker host"
		}
		return "", fmt.Errorf("docker engine at %s does not answer: %w", where, err)
	}
	return v.Version, nil
}

// WaitReady pings until the engine answers or ctx/timeout ends (the VM's
// engine needs a moment after boot).
func (c *Client) WaitReady(ctx context.Context, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		v, err := c.Ping(ctx)
		if err == nil {
			return v, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func isNotFound(err error) bool { return err != nil && cerrdefs.IsNotFound(err) }

func isConflict(err error) bool {
	return err != nil && (cerrdefs.IsConflict(err) || cerrdefs.IsAlreadyExists(err))
}

var errNotManaged = errors.New("not created by klimax")

// ImageExists reports whether the engine has the image ref locally.
func (c *Client) ImageExists(ctx context.Context, ref string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err := c.api.ImageInspect(ctx, ref)
	if isNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inspect image %s: %w", ref, err)
	}
	return true, nil
}
