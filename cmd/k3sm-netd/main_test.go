package main

import (
	"testing"

	"github.com/k3sm-dev/k3sm/internal/supervisor"
)

func TestParentFDEnvIsTheSupervisors(t *testing.T) {
	if parentFDEnv != supervisor.ParentFDEnv {
		t.Fatalf("k3sm-netd watches %s, the supervisor sets %s", parentFDEnv, supervisor.ParentFDEnv)
	}
}
