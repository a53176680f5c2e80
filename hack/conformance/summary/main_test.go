package main

import (
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	in := `[{"SuiteDescription":"Kubernetes e2e suite","RunTime":60000000000,"SpecReports":[
{"LeafNodeType":"SynchronizedBeforeSuite","State":"passed"},
{"ContainerHierarchyTexts":["[sig-node] Pods"],"LeafNodeType":"It","LeafNodeText":"should run [Conformance]","State":"passed"},
{"ContainerHierarchyTexts":["[sig-node] Probing"],"LeafNodeType":"It","LeafNodeText":"should restart [Conformance]","State":"failed","Failure":{"Message":"Unexpected error:\n    <*errors.errorString>: \n    pod never restarted\n"}},
{"ContainerHierarchyTexts":["[sig-apps] Deployment"],"LeafNodeType":"It","LeafNodeText":"rolls [Conformance]","State":"skipped"}]}]`
	var out strings.Builder
	if err := summarize(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"Ran 2 specs in 1m0s: 1 passed, 1 failed (1 skipped).",
		"| node | 1 | 1 |",
		"- [sig-node] Probing should restart [Conformance]: `pod never restarted` (failed)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "| apps |") {
		t.Errorf("a SIG with only skipped specs is listed:\n%s", got)
	}
	if err := summarize(strings.NewReader("{}"), &out); err == nil {
		t.Error("a non-report was accepted")
	}
}
