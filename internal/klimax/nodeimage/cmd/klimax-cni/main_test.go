package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestConfig(t *testing.T) {
	out, err := Config("10.11.0.0/24")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type string
			IPAM struct {
				Type   string
				Ranges [][]struct{ Subnet string }
			}
		}
	}
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Plugins) != 2 || c.Plugins[0].Type != "bridge" || c.Plugins[1].Type != "portmap" ||
		c.Plugins[0].IPAM.Type != "host-local" || c.Plugins[0].IPAM.Ranges[0][0].Subnet != "10.11.0.0/24" {
		t.Fatalf("config: %s", out)
	}
	if _, err := Config("10.11.0.0"); err == nil {
		t.Fatal("a podCIDR without a prefix length was accepted")
	}
}

func TestWriteConfigOnlyOnChange(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net.d")
	if changed, err := writeConfig(dir, "10.12.0.0/24"); err != nil || !changed {
		t.Fatalf("first write: %v %v", changed, err)
	}
	if changed, err := writeConfig(dir, "10.12.0.0/24"); err != nil || changed {
		t.Fatalf("same config rewritten: %v %v", changed, err)
	}
	if changed, _ := writeConfig(dir, "10.12.1.0/24"); !changed {
		t.Fatal("a new podCIDR did not rewrite the config")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("files left in %s: %v", dir, ents)
	}
}
