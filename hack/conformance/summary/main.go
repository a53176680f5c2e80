// Command summary turns ginkgo's JSON report of a conformance run into the
// Markdown that docs/conformance.md records: totals, passed/failed per SIG
// and each failure with the first line of its reason.
//
//	go run ./hack/conformance/summary _output/conformance/report.json
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// The fields of ginkgo v2's types.Report this needs; decoding by hand keeps
// ginkgo out of the module.
type report struct {
	SuiteDescription string
	RunTime          time.Duration
	SpecReports      []spec
}

type spec struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
	RunTime                 time.Duration
	Failure                 struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
	}
}

func (s spec) text() string {
	return strings.TrimSpace(strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " "))
}

var sigRE = regexp.MustCompile(`\[sig-([a-z-]+)\]`)

func (s spec) sig() string {
	if m := sigRE.FindStringSubmatch(s.text()); m != nil {
		return m[1]
	}
	return "other"
}

type counts struct{ passed, failed, skipped int }

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: summary REPORT.json (ginkgo --json-report)")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "summary:", err)
		os.Exit(1)
	}
	defer f.Close()
	if err := summarize(f, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "summary:", err)
		os.Exit(1)
	}
}

func summarize(r io.Reader, w io.Writer) error {
	var reports []report
	if err := json.NewDecoder(r).Decode(&reports); err != nil {
		return fmt.Errorf("not a ginkgo JSON report: %w", err)
	}
	bySIG := map[string]*counts{}
	var total counts
	var failures []spec
	var wall time.Duration
	for _, rep := range reports {
		wall += rep.RunTime
		for _, s := range rep.SpecReports {
			if s.LeafNodeType != "It" {
				// Suite-level nodes (SynchronizedBeforeSuite...) fail the
				// run too: list them, count no spec.
				if s.State == "failed" || s.State == "panicked" || s.State == "timedout" || s.State == "aborted" {
					failures = append(failures, s)
				}
				continue
			}
			c := bySIG[s.sig()]
			if c == nil {
				c = &counts{}
				bySIG[s.sig()] = c
			}
			switch s.State {
			case "passed":
				c.passed++
				total.passed++
			case "skipped", "pending":
				c.skipped++
				total.skipped++
			default:
				c.failed++
				total.failed++
				failures = append(failures, s)
			}
		}
	}
	fmt.Fprintf(w, "Ran %d specs in %s: %d passed, %d failed (%d skipped).\n\n",
		total.passed+total.failed, wall.Round(time.Second), total.passed, total.failed, total.skipped)
	fmt.Fprintln(w, "| SIG | passed | failed |")
	fmt.Fprintln(w, "|---|---:|---:|")
	sigs := make([]string, 0, len(bySIG))
	for s := range bySIG {
		sigs = append(sigs, s)
	}
	sort.Strings(sigs)
	for _, s := range sigs {
		c := bySIG[s]
		if c.passed+c.failed == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %d |\n", s, c.passed, c.failed)
	}
	if len(failures) == 0 {
		return nil
	}
	sort.Slice(failures, func(i, j int) bool { return failures[i].text() < failures[j].text() })
	fmt.Fprintf(w, "\nFailed (%d):\n\n", len(failures))
	for _, s := range failures {
		fmt.Fprintf(w, "- %s: %s (%s)\n", s.text(), reason(s.Failure.Message), s.State)
	}
	return nil
}

// reason is the failure message's first meaningful line, shortened.
func reason(msg string) string {
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l == "Unexpected error:" || strings.HasPrefix(l, "<") {
			continue
		}
		if len(l) > 200 {
			l = l[:200] + "…"
		}
		return "`" + strings.ReplaceAll(l, "`", "'") + "`"
	}
	return "(no message)"
}
