// Package helmwire is what k3sm and its helm helper, k3sm-helm, exchange:
// one Request as JSON on the helper's stdin, one Response as JSON on its
// stdout. It links nothing of helm, so the k3sm binary (every process of
// the server) stays without the helm SDK's package initialisation.
package helmwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Op is what the helper does with the release.
type Op string

const (
	// OpRelease reads the release's latest revision (and compares its
	// values with the request's when CompareValues).
	OpRelease Op = "release"
	// OpDeploy loads the chart and installs it, or upgrades the release.
	OpDeploy Op = "deploy"
	// OpUninstall uninstalls the release; a missing release is no error.
	OpUninstall Op = "uninstall"
)

// Request is one helm operation on one release.
type Request struct {
	Op         Op     `json:"op"`
	Kubeconfig string `json:"kubeconfig"` // the file the helper connects with
	Release    string `json:"release"`
	Namespace  string `json:"namespace"` // the release's

	// Values are the HelmChart's values layers merged; Set is its
	// spec.set, which the helper applies over them as helm's --set
	// (strings as --set-string). For OpDeploy, and OpRelease with
	// CompareValues.
	Values        Values `json:"values,omitempty"`
	Set           Values `json:"set,omitempty"`
	CompareValues bool   `json:"compareValues,omitempty"`

	// OpDeploy: the chart is ChartContent (spec.chartContent, base64 of a
	// .tgz) if set, else what Source names.
	ChartContent    string        `json:"chartContent,omitempty"`
	Source          *Source       `json:"source,omitempty"`
	Timeout         time.Duration `json:"timeout,omitempty"`
	CreateNamespace bool          `json:"createNamespace,omitempty"`
}

// Source is where a chart comes from and how it is reached: the HelmChart's
// fields with the Secrets and ConfigMap they name already read by k3sm.
type Source struct {
	Namespace string `json:"namespace"` // the HelmChart's, named in hints
	Chart     string `json:"chart"`     // a name in Repo, oci://host/path/name, or an http(s) URL of a .tgz
	Version   string `json:"version,omitempty"`
	Repo      string `json:"repo,omitempty"`

	Username           string `json:"username,omitempty"` // spec.authSecret
	Password           string `json:"password,omitempty"`
	PassCredentialsAll bool   `json:"passCredentialsAll,omitempty"` // spec.authPassCredentials
	CA                 []byte `json:"ca,omitempty"`                 // PEM: spec.repoCA and spec.repoCAConfigMap
	Insecure           bool   `json:"insecure,omitempty"`           // spec.insecureSkipTLSVerify
	PlainHTTP          bool   `json:"plainHTTP,omitempty"`
	// Docker holds spec.dockerRegistrySecret's credentials by registry
	// host[:port]; nil when the field is not set.
	Docker map[string]Credential `json:"docker,omitempty"`
}

// Credential is one registry's entry of a Docker config.json.
type Credential struct {
	Username     string `json:"username,omitempty"`
	Password     string `json:"password,omitempty"`
	RefreshToken string `json:"refreshToken,omitempty"`
}

// Stage says which step failed, so that k3sm reports it as the in-process
// controller did.
type Stage string

const (
	StageHelper    Stage = "helper"    // the request or the connection to the cluster
	StageValues    Stage = "values"    // spec.set
	StageRelease   Stage = "release"   // reading the release
	StageChart     Stage = "chart"     // loading or fetching the chart
	StageInstall   Stage = "install"   // install or upgrade
	StageUninstall Stage = "uninstall" // uninstall
)

// Error is a failed operation; Message is the whole text shown on the
// HelmChart's status.
type Error struct {
	Stage   Stage  `json:"stage"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Response is the outcome of a Request.
type Response struct {
	Error *Error `json:"error,omitempty"`

	// OpRelease: whether a release exists, its latest revision, whether
	// that is deployed, and whether its values are the request's.
	Found      bool `json:"found,omitempty"`
	Deployed   bool `json:"deployed,omitempty"`
	SameValues bool `json:"sameValues,omitempty"`

	// OpRelease and OpDeploy: the revision (for OpDeploy, the new one)
	// and, for OpDeploy, the chart that was deployed.
	Revision     int    `json:"revision,omitempty"`
	ChartName    string `json:"chartName,omitempty"`
	ChartVersion string `json:"chartVersion,omitempty"`
}

// MaxRequest bounds what the helper reads: a chart's content is at most an
// object's size in the API (~1.5 MiB), base64 in the request.
const MaxRequest = 16 << 20

// Decode reads one JSON document into v from r, refusing unknown fields
// (k3sm and k3sm-helm from different builds) and trailing data.
func Decode(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON document")
	}
	return nil
}

// Values are helm values. On the wire a number keeps its Go type:
// int64 (from the HelmChart's spec.values) and float64 (from YAML, even
// when integral) render differently in templates ("1000000" and "1e+06"),
// and plain JSON would turn both into float64.
type Values map[string]any

// MarshalJSON writes every float64 with a '.' or an exponent, so that
// UnmarshalJSON tells it from an integer.
func (v Values) MarshalJSON() ([]byte, error) {
	if v == nil {
		return []byte("null"), nil
	}
	var buf bytes.Buffer
	if err := writeValue(&buf, map[string]any(v)); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeValue(buf *bytes.Buffer, x any) error {
	switch t := x.(type) {
	case float64:
		if math.IsInf(t, 0) || math.IsNaN(t) {
			return fmt.Errorf("helm values: %v is not a JSON number", t)
		}
		s := strconv.FormatFloat(t, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eE") {
			s += ".0"
		}
		buf.WriteString(s)
	case map[string]any:
		buf.WriteByte('{')
		first := true
		for k, e := range t {
			if !first {
				buf.WriteByte(',')
			}
			first = false
			kb, err := json.Marshal(k)
			if err != nil {
				return err
			}
			buf.Write(kb)
			buf.WriteByte(':')
			if err := writeValue(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeValue(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	default:
		b, err := json.Marshal(t)
		if err != nil {
			return err
		}
		buf.Write(b)
	}
	return nil
}

// UnmarshalJSON reads integers as int64 and the rest as float64.
func (v *Values) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return err
	}
	if m == nil {
		*v = nil
		return nil
	}
	out, err := numbers(m)
	if err != nil {
		return err
	}
	*v = out.(map[string]any)
	return nil
}

func numbers(x any) (any, error) {
	switch t := x.(type) {
	case json.Number:
		s := t.String()
		if !strings.ContainsAny(s, ".eE") {
			if i, err := strconv.ParseInt(s, 10, 64); err == nil {
				return i, nil
			}
		}
		return strconv.ParseFloat(s, 64)
	case map[string]any:
		for k, e := range t {
			n, err := numbers(e)
			if err != nil {
				return nil, err
			}
			t[k] = n
		}
	case []any:
		for i, e := range t {
			n, err := numbers(e)
			if err != nil {
				return nil, err
			}
			t[i] = n
		}
	}
	return x, nil
}
