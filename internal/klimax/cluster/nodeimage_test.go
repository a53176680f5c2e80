package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/k3sm-dev/k3sm/internal/klimax/config"
)

func TestNodeImage(t *testing.T) {
	have := map[string]bool{"klimax/node:v1.37.2": true}
	exists := func(_ context.Context, ref string) (bool, error) { return have[ref], nil }
	for _, tc := range []struct {
		repo, version string
		exists        func(context.Context, string) (bool, error)
		want, err     string
	}{
		{"", "v1.37.2", exists, "klimax/node:v1.37.2", ""},
		{"", "v1.35.0", exists, "kindest/node:v1.35.0", ""},
		{"", "v1.37.2", nil, "kindest/node:v1.37.2", ""},
		{"klimax/node", "v1.37.2", exists, "klimax/node:v1.37.2", ""},
		{"klimax/node", "v1.36.0", exists, "", "no node image klimax/node:v1.36.0 in the Docker engine: run `klimax node-image build`"},
		{"klimax/node", "v1.37.2", func(context.Context, string) (bool, error) { return false, errors.New("engine down") }, "", "engine down"},
		{"registry.local:5000/kind/node", "v1.37.2", exists, "registry.local:5000/kind/node:v1.37.2", ""},
	} {
		cfg := config.Default()
		cfg.Kind.NodeImage = tc.repo
		m := &Manager{Config: cfg, ImageExists: tc.exists}
		got, err := m.NodeImage(context.Background(), tc.version)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q %s: err %v, want %q", tc.repo, tc.version, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q %s: %q %v, want %q", tc.repo, tc.version, got, err, tc.want)
		}
	}
}
