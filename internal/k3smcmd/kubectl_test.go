package k3smcmd

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestKubectlTarget(t *testing.T) {
	withCluster := t.TempDir()
	admin := filepath.Join(withCluster, "admin.kubeconfig")
	if err := os.WriteFile(admin, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	homeWithConfig := t.TempDir()
	os.MkdirAll(filepath.Join(homeWithConfig, ".kube"), 0o700)
	os.WriteFile(filepath.Join(homeWithConfig, ".kube", "config"), []byte("x"), 0o600)
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name     string
		args     []string
		env      func(string) string
		home     string
		wantArgs []string
		wantKC   string
		wantErr  string // substrings of the error, | separated
		wantNote string
	}{
		{name: "--data-dir is k3sm's and stripped", args: []string{"--data-dir", withCluster, "get", "pods"}, env: env(),
			wantArgs: []string{"get", "pods"}, wantKC: admin},
		{name: "--data-dir=", args: []string{"get", "--data-dir=" + withCluster, "pods"}, env: env(),
			wantArgs: []string{"get", "pods"}, wantKC: admin},
		{name: "K3SM_DATA_DIR", args: []string{"get", "pods"}, env: env("K3SM_DATA_DIR", withCluster),
			wantArgs: []string{"get", "pods"}, wantKC: admin},
		{name: "after -- args are the command's", args: []string{"exec", "p", "--", "ls", "--data-dir", "x"}, env: env("K3SM_DATA_DIR", withCluster),
			wantArgs: []string{"exec", "p", "--", "ls", "--data-dir", "x"}, wantKC: admin},
		{name: "--kubeconfig wins", args: []string{"--kubeconfig", "/x", "get", "pods"}, env: env("K3SM_DATA_DIR", withCluster),
			wantArgs: []string{"--kubeconfig", "/x", "get", "pods"}},
		{name: "$KUBECONFIG wins", args: []string{"get", "pods"}, env: env("KUBECONFIG", "/x", "K3SM_DATA_DIR", withCluster),
			wantArgs: []string{"get", "pods"}},
		{name: "both named", args: []string{"--data-dir", withCluster, "--kubeconfig=/x", "get"}, env: env(),
			wantErr: "--data-dir and --kubeconfig"},
		{name: "wrong --data-dir names the file and the fixes", args: []string{"--data-dir", empty, "get", "pods"}, env: env(), home: homeWithConfig,
			wantErr: filepath.Join(empty, "admin.kubeconfig") + "|--data-dir DIR|K3SM_DATA_DIR=DIR|--kubeconfig FILE"},
		{name: "wrong K3SM_DATA_DIR, no ~/.kube/config", args: []string{"get", "pods"}, env: env("K3SM_DATA_DIR", empty), home: t.TempDir(),
			wantErr: filepath.Join(empty, "admin.kubeconfig") + "|$K3SM_DATA_DIR|--kubeconfig FILE"},
		{name: "wrong K3SM_DATA_DIR falls back to ~/.kube/config with a note", args: []string{"get", "pods"}, env: env("K3SM_DATA_DIR", empty), home: homeWithConfig,
			wantArgs: []string{"get", "pods"}, wantNote: "using ~/.kube/config"},
		{name: "--data-dir without a value", args: []string{"get", "--data-dir"}, env: env(), wantErr: "--data-dir needs a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, kc, note, err := kubectlTarget(tc.args, tc.env, tc.home)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("no error; args %v kubeconfig %q", args, kc)
				}
				for _, w := range strings.Split(tc.wantErr, "|") {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(args, tc.wantArgs) || kc != tc.wantKC {
				t.Errorf("got args %v kubeconfig %q, want %v %q", args, kc, tc.wantArgs, tc.wantKC)
			}
			if !strings.Contains(note, tc.wantNote) || (tc.wantNote == "" && note != "") {
				t.Errorf("note %q, want %q", note, tc.wantNote)
			}
		})
	}
}
