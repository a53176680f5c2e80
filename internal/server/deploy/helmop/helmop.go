// Package helmop runs the helm operations of the HelmChart controller with
// the helm v3 SDK. Only k3sm-helm links it: the controller in k3sm sends it
// a helmwire.Request and reads a helmwire.Response.
package helmop

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"

	"github.com/k3sm-dev/k3sm/internal/server/deploy/helmwire"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	"helm.sh/helm/v3/pkg/strvals"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Run carries out req; log gets helm's debug lines. A failure is in the
// Response's Error.
func Run(ctx context.Context, req *helmwire.Request, log func(string)) *helmwire.Response {
	resp, err := run(ctx, req, log)
	if err != nil {
		var we *helmwire.Error
		if !errors.As(err, &we) {
			we = &helmwire.Error{Stage: helmwire.StageHelper, Message: err.Error()}
		}
		return &helmwire.Response{Error: we}
	}
	return resp
}

func fail(stage helmwire.Stage, err error) error {
	return &helmwire.Error{Stage: stage, Message: err.Error()}
}

func run(ctx context.Context, req *helmwire.Request, log func(string)) (*helmwire.Response, error) {
	if req.Release == "" || req.Namespace == "" {
		return nil, errors.New("the request names no release or namespace")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", req.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", req.Kubeconfig, err)
	}
	rc.UserAgent = "k3sm-helm"
	rc.QPS, rc.Burst = 100, 200
	cfg, err := actionConfig(rc, req.Namespace, log)
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case helmwire.OpUninstall:
		un := action.NewUninstall(cfg)
		un.Wait = false
		if _, err := un.Run(req.Release); err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
			return nil, fail(helmwire.StageUninstall, err)
		}
		return &helmwire.Response{}, nil
	case helmwire.OpRelease:
		var vals map[string]any
		if req.CompareValues {
			if vals, err = values(req); err != nil {
				return nil, fail(helmwire.StageValues, err)
			}
		}
		rel, err := action.NewGet(cfg).Run(req.Release)
		if errors.Is(err, driver.ErrReleaseNotFound) {
			return &helmwire.Response{}, nil
		}
		if err != nil {
			return nil, fail(helmwire.StageRelease, err)
		}
		return &helmwire.Response{Found: true, Revision: rel.Version, Deployed: rel.Info != nil && rel.Info.Status == release.StatusDeployed,
			SameValues: req.CompareValues && sameValues(rel.Config, vals)}, nil
	case helmwire.OpDeploy:
		vals, err := values(req)
		if err != nil {
			return nil, fail(helmwire.StageValues, err)
		}
		ch, err := loadChart(req)
		if err != nil {
			return nil, fail(helmwire.StageChart, err)
		}
		rel, err := installOrUpgrade(ctx, cfg, req, ch, vals)
		if err != nil {
			return nil, fail(helmwire.StageInstall, err)
		}
		return &helmwire.Response{Revision: rel.Version, ChartName: ch.Metadata.Name, ChartVersion: ch.Metadata.Version}, nil
	}
	return nil, fmt.Errorf("unknown operation %q", req.Op)
}

func actionConfig(rc *rest.Config, namespace string, log func(string)) (*action.Configuration, error) {
	cfg := new(action.Configuration)
	debug := func(format string, v ...any) { log(fmt.Sprintf(format, v...)) }
	if err := cfg.Init(newGetter(rc, namespace), namespace, "secret", debug); err != nil {
		return nil, err
	}
	return cfg, nil
}

func installOrUpgrade(ctx context.Context, cfg *action.Configuration, req *helmwire.Request, ch *chart.Chart, vals map[string]any) (*release.Release, error) {
	name, target, timeout := req.Release, req.Namespace, req.Timeout
	hist := action.NewHistory(cfg)
	hist.Max = 1
	rels, err := hist.Run(name)
	if errors.Is(err, driver.ErrReleaseNotFound) || (err == nil && len(rels) == 0) {
		in := action.NewInstall(cfg)
		in.ReleaseName, in.Namespace, in.Timeout = name, target, timeout
		in.CreateNamespace = req.CreateNamespace
		return in.RunWithContext(ctx, ch, vals)
	}
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Timeout, up.MaxHistory = target, timeout, 10
	rel, err := up.RunWithContext(ctx, name, ch, vals)
	if err != nil && strings.Contains(err.Error(), "has no deployed releases") {
		// A first install that failed leaves nothing to upgrade: start over.
		if _, uerr := action.NewUninstall(cfg).Run(name); uerr != nil && !errors.Is(uerr, driver.ErrReleaseNotFound) {
			return nil, uerr
		}
		in := action.NewInstall(cfg)
		in.ReleaseName, in.Namespace, in.Timeout = name, target, timeout
		return in.RunWithContext(ctx, ch, vals)
	}
	return rel, err
}

// loadChart reads the chart from spec.chartContent, or from the source
// spec.chart names (a repository, an OCI registry or a URL).
func loadChart(req *helmwire.Request) (*chart.Chart, error) {
	if req.ChartContent != "" {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(req.ChartContent))
		if err != nil {
			return nil, fmt.Errorf("spec.chartContent is not base64 (make it with `base64 -w0 chart.tgz`): %w", err)
		}
		ch, err := loader.LoadArchive(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("spec.chartContent: %w", err)
		}
		return ch, nil
	}
	if req.Source == nil {
		return nil, errors.New("the request has neither chart content nor a source")
	}
	tmp, err := os.MkdirTemp("", "k3sm-helm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	return (&source{Source: *req.Source}).fetch(tmp)
}

// values are the request's values with spec.set applied over them.
func values(req *helmwire.Request) (map[string]any, error) {
	vals := map[string]any(req.Values)
	if vals == nil {
		vals = map[string]any{}
	}
	if err := applySet(req.Set, vals); err != nil {
		return nil, err
	}
	return vals, nil
}

// applySet applies spec.set over vals, keys in sorted order, as helm --set
// (strings as --set-string).
func applySet(set map[string]any, vals map[string]any) error {
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var err error
		switch v := set[k].(type) {
		case string:
			err = strvals.ParseIntoString(k+"="+v, vals)
		default:
			err = strvals.ParseInto(fmt.Sprintf("%s=%v", k, v), vals)
		}
		if err != nil {
			return fmt.Errorf("spec.set.%s: %w", k, err)
		}
	}
	return nil
}

// sameValues compares values as JSON (helm stores a release's values as
// JSON, so numbers come back as float64).
func sameValues(a, b map[string]any) bool {
	if a == nil {
		a = map[string]any{}
	}
	if b == nil {
		b = map[string]any{}
	}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	if err1 != nil || err2 != nil {
		return false
	}
	var na, nb any
	if json.Unmarshal(ja, &na) != nil || json.Unmarshal(jb, &nb) != nil {
		return false
	}
	return reflect.DeepEqual(na, nb)
}
