//go:build linux

package main

import (
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	s := time.Second
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, -1},
		{[]time.Duration{3 * s}, 3 * s},
		{[]time.Duration{5 * s, 1 * s, 3 * s, 2 * s, 4 * s}, 3 * s},
		{[]time.Duration{4 * s, 1 * s, 2 * s, 3 * s}, 2500 * time.Millisecond},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestRole(t *testing.T) {
	for _, c := range []struct {
		exe  string
		args []string
		want string
	}{
		{"/tmp/k3sm-join-1/agent-bin/k3sm", []string{"/tmp/k3sm-join-1/agent-bin/k3sm", "agent", "--server", "x"}, "k3sm agent"},
		{"/tmp/k3sm-join-1/agent-bin/k3sm", []string{"k3sm", "node", "--config=/x"}, "k3sm node"},
		{"/tmp/k3sm-join-1/agent-bin/k3sm (deleted)", []string{"k3sm", "node"}, "k3sm node"},
		{"/tmp/k3sm-join-1/agent-bin/k3sm-runtimed", []string{"k3sm-runtimed", "--config=/x"}, "k3sm-runtimed"},
		{"", []string{"/usr/bin/k3sm-netd"}, "k3sm-netd"},
		{"/bin/k3sm", []string{"k3sm", "--help"}, "k3sm"},
	} {
		if got := role(c.exe, c.args); got != c.want {
			t.Errorf("role(%q, %q) = %q, want %q", c.exe, c.args, got, c.want)
		}
	}
}

func TestParseSmapsRollup(t *testing.T) {
	in := "55d0c0000000-7ffd00000000 ---p 00000000 00:00 0  [rollup]\n" +
		"Rss:               41236 kB\nPss:               20123 kB\nPss_Anon:          15000 kB\n"
	pss, rss, err := parseSmapsRollup(strings.NewReader(in))
	if err != nil || pss != 20123 || rss != 41236 {
		t.Fatalf("got pss %d rss %d err %v", pss, rss, err)
	}
	if _, _, err := parseSmapsRollup(strings.NewReader("Rss: 1 kB\n")); err == nil {
		t.Fatal("no Pss: line, no error")
	}
}

func TestParseStat(t *testing.T) {
	ppid, state, err := parseStat("4242 (k3sm (node) x) S 17 4242 4242 0 -1 4194560")
	if err != nil || ppid != 17 || state != "S" {
		t.Fatalf("got %d %q %v", ppid, state, err)
	}
}

func TestTree(t *testing.T) {
	all := []proc{{Pid: 1}, {Pid: 10, PPid: 1}, {Pid: 11, PPid: 10}, {Pid: 12, PPid: 11}, {Pid: 20, PPid: 1}}
	var got []int
	for _, p := range tree(all, 10) {
		got = append(got, p.Pid)
	}
	if len(got) != 3 || got[0] != 10 || got[1] != 11 || got[2] != 12 {
		t.Fatalf("tree of 10: %v", got)
	}
}

func TestRender(t *testing.T) {
	rs := []round{
		{N: 1, Node: "bench-agent-1", Joined: 400 * time.Millisecond, Ready: 2 * time.Second, Up: 2100 * time.Millisecond},
		{N: 2, Node: "bench-agent-2", Joined: 500 * time.Millisecond, Ready: 4 * time.Second, Up: 4100 * time.Millisecond},
		{N: 3, Node: "bench-agent-3", Joined: 300 * time.Millisecond, Ready: 2500 * time.Millisecond, Up: 2600 * time.Millisecond},
	}
	agent := []proc{{Role: "k3sm agent", PSS: 10240, RSS: 20480}, {Role: "k3sm node", PSS: 20480, RSS: 30720},
		{Role: "k3sm-runtimed", PSS: 5120, RSS: 8192}, {Role: "k3sm-netd", PSS: 2048, RSS: 4096}}
	server := []proc{{Role: "k3sm server", PSS: 102400, RSS: 204800}, {Role: "k3sm node", PSS: 15360, RSS: 30720},
		{Role: "k3sm-runtimed", PSS: 5120, RSS: 8192}}
	out := render(options{invocation: "bench/run.sh join", idle: 30 * time.Second}, machine{Commit: "abc1234-dirty"}, rs, agent, server)
	for _, want := range []string{
		"## Join: `k3sm agent` start to Node Ready",
		"| 2 | `bench-agent-2` | 500 | 3500 | 4000 | 4100 |",
		"| p50 | | 400 | 2200 | **2500** | 2600 |",
		"| max | | 500 | 3500 | 4000 | 4100 |",
		"≤ 3 s p50: met (p50 2500 ms over 3 joins)",
		"| `k3sm agent` | 10.0 | 20.0 | – | – |",
		"| `k3sm-netd` | 2.0 | 4.0 | – | – |",
		"| **total** | **37.0** (4 processes) | 62.0 | **20.0** (2 processes) | 38.0 |",
		"(control plane and its node, 3 processes): PSS 120.0 MiB",
		"`bench/run.sh join`",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
