package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// machine describes where and on what the benchmark ran.
type machine struct {
	Date               string
	CPUs               int
	CPUModel           string
	MemTotal           string
	Kernel, OS         string
	Commit             string
	DirtyTree          bool
	BinVersion         string
	BinSize            int64
	BinSHA             string
	LoadStart, LoadEnd string
}

func collectMachine(bin string) machine {
	m := machine{
		Date:      time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		CPUs:      runtime.NumCPU(),
		CPUModel:  procField("/proc/cpuinfo", "model name", ":"),
		Kernel:    strings.TrimSpace(readString("/proc/sys/kernel/osrelease")),
		OS:        strings.Trim(procField("/etc/os-release", "PRETTY_NAME", "="), `"`),
		LoadStart: loadAvg(),
	}
	if kb := procField("/proc/meminfo", "MemTotal", ":"); kb != "" {
		var n int64
		fmt.Sscanf(kb, "%d", &n)
		m.MemTotal = fmt.Sprintf("%.1f GiB", float64(n)/(1<<20))
	}
	if out, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil {
		m.DirtyTree = len(strings.TrimSpace(string(out))) > 0
	}
	if out, err := exec.Command(bin, "version").Output(); err == nil {
		m.BinVersion = strings.Join(strings.Fields(string(out)), " ")
	}
	if f, err := os.Open(bin); err == nil {
		h := sha256.New()
		if n, err := io.Copy(h, f); err == nil {
			m.BinSize, m.BinSHA = n, hex.EncodeToString(h.Sum(nil))[:16]
		}
		f.Close()
	}
	return m
}

func readString(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// procField returns the value of the first "key<sep>value" line of path.
func procField(path, key, sep string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), sep)
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func loadAvg() string {
	f := strings.Fields(readString("/proc/loadavg"))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func ms(d time.Duration) string {
	if d < 0 {
		return "?"
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

func msNum(d time.Duration) string {
	if d < 0 {
		return "?"
	}
	return fmt.Sprintf("%d", d.Milliseconds())
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func series(runs []*run, kind string, warm bool, f func(*run) time.Duration) []time.Duration {
	var out []time.Duration
	for _, r := range runs {
		if r.Kind == kind && r.Warm == warm {
			if v := f(r); v >= 0 {
				out = append(out, v)
			}
		}
	}
	return out
}

func ratio(a, b time.Duration) float64 {
	if a < 0 || b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

// addonRoles are the child roles beyond the control plane seen in any k3sm run.
func addonRoles(runs []*run) []string {
	core := map[string]bool{"kine": true, "kube-apiserver": true, "kube-scheduler": true, "kube-controller-manager": true, "kube-controllers": true}
	seen := map[string]bool{}
	var out []string
	for _, x := range runs {
		for r := range x.Spawn {
			if !core[r] && !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return median(spawns(runs, out[i])) < median(spawns(runs, out[j]))
	})
	return out
}

func spawns(runs []*run, role string) []time.Duration {
	var out []time.Duration
	for _, x := range runs {
		if d, ok := x.Spawn[role]; ok && d >= 0 {
			out = append(out, d)
		}
	}
	return out
}

func secs(d time.Duration) string { return fmt.Sprintf("%g s", d.Seconds()) }

func mib(kb int64) string { return fmt.Sprintf("%.1f", float64(kb)/1024) }

const ratioGoal = 1.3
const pssGoalMiB = 400 // issue 17 (was 500 in issue 2)

// renderReport formats the "Control plane" section of bench/RESULTS.md.
func renderReport(o options, m machine, r *results) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("## Control plane\n\n")
	w("Issue 2's figures, measured by `bench/controlplane`. Reproduce with `make bench` or\n")
	w("`bench/run.sh controlplane` (see docs/benchmarks.md).\n\n")
	w("- Date: %s\n", m.Date)
	w("- Machine: %s, kernel %s, %d CPUs (`nproc`), %s, %s RAM\n", m.OS, m.Kernel, m.CPUs, m.CPUModel, m.MemTotal)
	dirty := ""
	if m.DirtyTree {
		dirty = " (the shared working tree had uncommitted changes)"
	}
	w("- Measured binary: `k3sm version` = %s; %.0f MB, sha256 %s…\n", m.BinVersion, float64(m.BinSize)/1e6, m.BinSHA)
	w("- Repository at commit `%s`%s\n", m.Commit, dirty)
	if o.note != "" {
		w("- Note: %s\n", o.note)
	}
	if o.invocation != "" {
		w("- Command: `%s`\n", o.invocation)
	}
	w("- Program: `%s`\n", programLine())
	w("- Load average (1/5/15 min) at start %s, at end %s: the machine is shared, so rounds alternate\n", m.LoadStart, m.LoadEnd)
	w("  which side starts first and noise falls on both.\n\n")

	n := o.rounds
	w("### Cold start\n\n")
	w("Median of %d rounds; every time is from process start (`k3sm server`, or for the floor the\n", n)
	w("`kube-apiserver` process) to the first 200, polled every %d ms.\n\n", o.poll.Milliseconds())
	w("| milliseconds | fresh data dir | warm data dir |\n|---|---:|---:|\n")
	row := func(label string, kind string, f func(*run) time.Duration) {
		w("| %s | %s | %s |\n", label, msNum(median(series(r.Runs, kind, false, f))), msNum(median(series(r.Runs, kind, true, f))))
	}
	row("k3sm: kine's process spawned ¹ (after preflight and PKI; the apiserver's own since issue 17)", "k3sm", func(x *run) time.Duration { return x.KineSpawn })
	row("k3sm: kine socket accepts", "k3sm", func(x *run) time.Duration { return x.Kine })
	row("k3sm: kube-apiserver child spawned ¹", "k3sm", func(x *run) time.Duration { return x.APISpawn })
	row("**k3sm: apiserver /readyz 200**", "k3sm", func(x *run) time.Duration { return x.Readyz })
	row("k3sm: scheduler and controller-manager spawned ¹ (after the authorization bootstrap)", "k3sm", func(x *run) time.Duration { return max(x.SchedSpawn, x.CMSpawn) })
	row("k3sm: scheduler /healthz 200", "k3sm", func(x *run) time.Duration { return x.Sched })
	row("k3sm: controller-manager /healthz 200", "k3sm", func(x *run) time.Duration { return x.CM })
	for _, role := range addonRoles(r.Runs) {
		row("k3sm: "+role+" spawned ¹ (addon)", "k3sm", func(x *run) time.Duration {
			if d, ok := x.Spawn[role]; ok {
				return d
			}
			return -1
		})
	}
	row("k3sm: server logs `k3sm is up`", "k3sm", func(x *run) time.Duration { return x.UpLine })
	row("**k3sm: all healthy** ²", "k3sm", func(x *run) time.Duration { return x.AllUp })
	row("**floor: kube-apiserver alone → /readyz 200** ³", "floor", func(x *run) time.Duration { return x.Readyz })
	w("| *derived:* | | |\n")
	row("k3sm: apiserver spawn → /readyz (compare with the floor)", "k3sm", func(x *run) time.Duration {
		if x.APISpawn < 0 {
			return -1
		}
		return x.Readyz - x.APISpawn
	})
	row("k3sm: /readyz → scheduler and controller-manager spawned", "k3sm", func(x *run) time.Duration {
		if x.SchedSpawn < 0 || x.CMSpawn < 0 {
			return -1
		}
		return max(x.SchedSpawn, x.CMSpawn) - x.Readyz
	})
	row("k3sm: /readyz → all healthy", "k3sm", func(x *run) time.Duration { return x.AllUp - x.Readyz })
	type rs struct{ ready, all float64 }
	var rat [2]rs
	for i, warm := range []bool{false, true} {
		fl := median(series(r.Runs, "floor", warm, func(x *run) time.Duration { return x.Readyz }))
		rat[i].ready = ratio(median(series(r.Runs, "k3sm", warm, func(x *run) time.Duration { return x.Readyz })), fl)
		rat[i].all = ratio(median(series(r.Runs, "k3sm", warm, func(x *run) time.Duration { return x.AllUp })), fl)
	}
	w("| **ratio k3sm /readyz ÷ floor** | **%.2f×** | **%.2f×** |\n", rat[0].ready, rat[1].ready)
	w("| **ratio k3sm all healthy ÷ floor** | **%.2f×** | **%.2f×** |\n\n", rat[0].all, rat[1].all)
	w("Goal k3sm ≤ %.1f× the floor: /readyz %s fresh, %s warm; all healthy %s fresh, %s warm.\n\n",
		ratioGoal, verdict(rat[0].ready <= ratioGoal), verdict(rat[1].ready <= ratioGoal),
		verdict(rat[0].all <= ratioGoal), verdict(rat[1].all <= ratioGoal))
	w("1. From the `/proc/<pid>/stat` start times of the server and of its children (10 ms resolution).\n")
	w("2. The last of: the server logs `k3sm is up` (which it does once its addons, such as the runtime\n")
	w("   daemon and the node, are ready too), apiserver /readyz, scheduler and controller-manager /healthz\n")
	w("   on their loopback ports all answer 200.\n")
	w("3. `k3sm kine` and `k3sm kube-apiserver` started directly, as two processes, with the exact command\n")
	w("   lines and kine config the server gave its children (read from /proc in a template run; the server\n")
	w("   runs kine in the apiserver's process), cwd `<data>/server`, the server's certificates copied in.\n")
	w("   kine is already serving when the apiserver clock starts. Fresh: empty\n")
	w("   `server/db`; warm: the datastore that round's fresh floor run left behind.\n\n")
	if t := r.Template; t != nil {
		w("A template run before the rounds (fresh data dir, page cache warm-up, not counted): /readyz %s,\n", ms(t.Readyz))
		w("all healthy %s.\n\n", ms(t.AllUp))
	}

	w("Every round (ms; server log = the server's own `apiserver ready after` / `k3sm is up in`):\n\n")
	w("| round | data dir | k3sm kine | k3sm apiserver spawned | k3sm /readyz | k3sm sched+cm spawned | k3sm all healthy | server log | floor /readyz | ratio /readyz | ratio all healthy |\n")
	w("|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
	for round := 1; round <= n; round++ {
		for _, warm := range []bool{false, true} {
			var k, f *run
			for _, x := range r.Runs {
				if x.Round == round && x.Warm == warm {
					if x.Kind == "k3sm" {
						k = x
					} else {
						f = x
					}
				}
			}
			if k == nil || f == nil {
				continue
			}
			state := "fresh"
			if warm {
				state = "warm"
			}
			first := "k3sm first"
			if round%2 == 0 {
				first = "floor first"
			}
			extra := ""
			if k.Restarts > 0 {
				extra = fmt.Sprintf(", %d restart(s)!", k.Restarts)
			}
			w("| %d | %s (%s) | %s | %s | %s | %s | %s | %s / %s%s | %s | %.2f× | %.2f× |\n", round, state, first,
				msNum(k.Kine), msNum(k.APISpawn), msNum(k.Readyz), msNum(max(k.SchedSpawn, k.CMSpawn)), msNum(k.AllUp), k.SelfReady, k.SelfUp, extra,
				msNum(f.Readyz), ratio(k.Readyz, f.Readyz), ratio(k.AllUp, f.Readyz))
		}
	}
	w("\n")

	w("### Memory after %s idle\n\n", secs(o.idle))
	w("`k3sm server` on a fresh data dir, read %s after every component was healthy; every process of the\n", secs(o.idle))
	w("tree under the server pid, from `/proc/<pid>/smaps_rollup`. MiB = 1024 KiB.\n\n")
	sum := memTable(&sb, r.K3smMem)
	w("Goal ≤ %d MiB PSS for the whole idle server: %s (%s MiB).\n\n", pssGoalMiB, verdict(sum.PSS <= pssGoalMiB*1024), mib(sum.PSS))
	if len(r.FloorMem) > 0 {
		w("For comparison, the floor (kine + kube-apiserver alone, fresh datastore, %s after /readyz):\n\n", secs(o.idle))
		memTable(&sb, r.FloorMem)
	}
	w("PSS divides each shared page among the processes that map it. The benchmark runs a private copy\n")
	w("of the binary so its pages are shared only among the measured processes")
	if o.privateBin {
		if len(r.OtherUsers) == 0 {
			w("; no other process ran that copy during the reading.\n")
		} else {
			w("; other processes running it during the reading: %v (their share is missing from the PSS).\n", r.OtherUsers)
		}
	} else {
		w(", **but this run used -private-bin=false**: other processes running the same binary (%d) lower the PSS.\n", len(r.OtherUsers))
	}
	w("PSS file is mostly the binary's text and data shared by every process of the tree; PSS anon is\n")
	w("each process's own heap and stacks.\n\n")
	return sb.String()
}

// memTable writes one row per process and a sum row, and returns the sum.
func memTable(sb *strings.Builder, ms []memory) memory {
	var sum memory
	fmt.Fprintf(sb, "| process | pid | RSS MiB | PSS MiB | PSS anon MiB | PSS file MiB |\n|---|---:|---:|---:|---:|---:|\n")
	for i, m := range ms {
		name := m.Role
		if i == 0 && name == "server" {
			name = "k3sm server (supervisor)"
		}
		fmt.Fprintf(sb, "| %s | %d | %s | %s | %s | %s |\n", name, m.Pid, mib(m.RSS), mib(m.PSS), mib(m.PSSAnon), mib(m.PSSFile))
		sum.RSS += m.RSS
		sum.PSS += m.PSS
		sum.PSSAnon += m.PSSAnon
		sum.PSSFile += m.PSSFile
	}
	fmt.Fprintf(sb, "| **sum (%d processes)** | | **%s** | **%s** | %s | %s |\n\n", len(ms), mib(sum.RSS), mib(sum.PSS), mib(sum.PSSAnon), mib(sum.PSSFile))
	return sum
}

// programLine is this program's command line with the home of the
// repository made relative, so the report reads the same on every machine.
func programLine() string {
	wd, _ := os.Getwd()
	args := []string{"bench/controlplane"}
	skip := false
	for _, a := range os.Args[1:] {
		// -invocation and -note are shown on their own lines.
		if skip {
			skip = false
			continue
		}
		if name := strings.TrimLeft(a, "-"); a != name && (name == "invocation" || name == "note") {
			skip = true
			continue
		}
		if strings.HasPrefix(a, "-invocation=") || strings.HasPrefix(a, "--invocation=") || strings.HasPrefix(a, "-note=") || strings.HasPrefix(a, "--note=") {
			continue
		}
		if wd != "" {
			a = strings.ReplaceAll(a, wd+string(filepath.Separator), "")
		}
		if a == "" || strings.ContainsAny(a, " \t'\"") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		args = append(args, a)
	}
	return strings.Join(args, " ")
}

// Markers around the generated section, which resultsfile.WriteSection
// replaces; other sections of the file are kept.
const (
	beginMark = "<!-- bench/controlplane: begin (generated by `make bench`; edits inside are overwritten) -->"
	endMark   = "<!-- bench/controlplane: end -->"
)
