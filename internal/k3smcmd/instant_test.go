package k3smcmd

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/k3sm-dev/k3sm/internal/server/controlplane"
)

// --node-instant-writes (the fair floor) implies --node-instant; neither
// is on by default.
func TestNodeInstantWritesImpliesInstant(t *testing.T) {
	for _, c := range []struct {
		args           []string
		instant, write bool
	}{
		{nil, false, false},
		{[]string{"--node-instant"}, true, false},
		{[]string{"--node-instant-writes"}, true, true},
		{[]string{"--node-instant-writes=false"}, false, false},
	} {
		cfg := &controlplane.Config{}
		f := pflag.NewFlagSet("server", pflag.ContinueOnError)
		serverFlags(f, cfg, &deployConfig{})
		if err := f.Parse(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if cfg.NodeInstant != c.instant || cfg.NodeInstantWrites != c.write {
			t.Errorf("%v: instant %v writes %v", c.args, cfg.NodeInstant, cfg.NodeInstantWrites)
		}
	}
}
