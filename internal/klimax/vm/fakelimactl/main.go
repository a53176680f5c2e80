// Command fakelimactl is a recording stand-in for limactl used by klimax's
// tests (Lima cannot run on Linux CI). It appends each invocation's argv as
// one JSON line to $FAKE_LIMACTL_LOG, keeps instance state in the JSON file
// $FAKE_LIMACTL_STATE, and answers like limactl for the subcommands klimax
// uses: list --json, create, start, stop, delete, shell. It refuses what
// real limactl refuses (creating twice, starting or shelling into a missing
// or stopped instance, a YAML without vmType vz).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

type instance struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Dir    string `json:"dir"`
	VMType string `json:"vmType"`
	Arch   string `json:"arch"`
	CPUs   int    `json:"cpus"`
	Memory int64  `json:"memory"`
	Disk   int64  `json:"disk"`
}

func main() {
	args := os.Args[1:]
	if log := os.Getenv("FAKE_LIMACTL_LOG"); log != "" {
		f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			line, _ := json.Marshal(args)
			f.Write(append(line, '\n'))
			f.Close()
		}
	}
	for len(args) > 0 && strings.HasPrefix(args[0], "--log-level") {
		args = args[1:]
	}
	if len(args) == 0 {
		fail("usage: limactl COMMAND")
	}
	state := load()
	switch args[0] {
	case "list":
		for _, in := range state {
			b, _ := json.Marshal(in)
			fmt.Println(string(b))
		}
	case "create":
		var nm, file string
		for _, a := range args[1:] {
			switch {
			case strings.HasPrefix(a, "--name="):
				nm = strings.TrimPrefix(a, "--name=")
			case a == "--tty=false":
			default:
				file = a
			}
		}
		if _, ok := state[nm]; ok {
			fail(fmt.Sprintf("instance %q already exists", nm))
		}
		data, err := os.ReadFile(file)
		if err != nil {
			fail(err.Error())
		}
		var y struct {
			VMType string `yaml:"vmType"`
			CPUs   int    `yaml:"cpus"`
		}
		if err := yaml.Unmarshal(data, &y); err != nil || y.VMType != "vz" {
			fail(fmt.Sprintf("invalid template %s: vmType %q, err %v", file, y.VMType, err))
		}
		state[nm] = instance{Name: nm, Status: "Stopped", Dir: "/fake/lima/" + nm, VMType: "vz", Arch: "aarch64", CPUs: y.CPUs, Memory: 10 << 30, Disk: 40 << 30}
	case "start", "stop":
		nm := args[len(args)-1]
		in, ok := state[nm]
		if !ok {
			fail(fmt.Sprintf("instance %q does not exist", nm))
		}
		in.Status = map[string]string{"start": "Running", "stop": "Stopped"}[args[0]]
		state[nm] = in
	case "delete":
		nm := args[len(args)-1]
		if _, ok := state[nm]; !ok {
			fail(fmt.Sprintf("instance %q does not exist", nm))
		}
		delete(state, nm)
	case "shell":
		rest := args[1:]
		for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
			rest = rest[1:]
		}
		if len(rest) == 0 {
			fail("shell: no instance")
		}
		in, ok := state[rest[0]]
		if !ok || in.Status != "Running" {
			fail(fmt.Sprintf("instance %q is not running", rest[0]))
		}
		guest(rest[1:])
	default:
		fail("unknown command " + args[0])
	}
	save(state)
}

// guest emulates the few guest commands the tests need.
func guest(argv []string) {
	if len(argv) >= 3 && argv[0] == "sudo" && argv[1] == "-n" && argv[2] == "--" {
		argv = argv[3:]
	}
	cmd := strings.Join(argv, " ")
	switch {
	case cmd == "ip -4 -j addr show dev lima0":
		fmt.Println(`[{"ifindex":3,"ifname":"lima0","addr_info":[{"family":"inet","local":"192.168.105.7","prefixlen":24,"scope":"global"}]}]`)
	case len(argv) == 2 && argv[0] == "sleep":
		d, _ := time.ParseDuration(argv[1] + "s")
		time.Sleep(d)
	case len(argv) > 0 && argv[0] == "echo":
		fmt.Println(strings.Join(argv[1:], " "))
	case cmd == "bash -s" || cmd == "cat":
		io.Copy(os.Stdout, os.Stdin)
	case len(argv) > 0 && argv[0] == "false":
		fmt.Fprintln(os.Stderr, "guest command failed")
		os.Exit(1)
	default:
		fail("fake guest: unsupported command: " + cmd)
	}
}

func statePath() string {
	p := os.Getenv("FAKE_LIMACTL_STATE")
	if p == "" {
		fail("FAKE_LIMACTL_STATE not set")
	}
	return p
}

func load() map[string]instance {
	st := map[string]instance{}
	data, err := os.ReadFile(statePath())
	if err == nil {
		json.Unmarshal(data, &st)
	}
	return st
}

func save(st map[string]instance) {
	data, _ := json.Marshal(st)
	if err := os.WriteFile(statePath(), data, 0o644); err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "limactl:", msg)
	os.Exit(1)
}
