// Package audit sets up the apiserver's audit log for `k3sm server
// --audit-log`: a default policy file (written once, then the operator's to
// edit) and the log's directory. Rotation is the apiserver's own
// (--audit-log-maxsize/maxbackup/maxage, set in controlplane).
package audit

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"sigs.k8s.io/yaml"
)

// Rotation of the audit log, passed to the apiserver.
const (
	MaxSizeMB  = 100
	MaxBackups = 10
	MaxAgeDays = 30
)

// DefaultPolicy logs every request at the Metadata level (who did what to
// which object, and the response code), never a request or response body:
// Secrets, tokens and ConfigMaps stay out of the log. Events from the
// RequestReceived stage are left out (each request is logged when it
// completes), and so are the apiserver's own health checks.
const DefaultPolicy = `# Written by k3sm for --audit-log. Edit it to log more (Request or
# RequestResponse levels) or less; k3sm never overwrites it.
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
  - RequestReceived
rules:
  # Health checks, every few seconds: not worth a line each.
  - level: None
    nonResourceURLs:
      - /healthz*
      - /readyz*
      - /livez*
  # Never bodies of Secrets, ConfigMaps or token requests and reviews.
  - level: Metadata
    resources:
      - group: ""
        resources: ["secrets", "configmaps", "serviceaccounts/token"]
      - group: authentication.k8s.io
        resources: ["tokenreviews"]
  # Everything else: Metadata too.
  - level: Metadata
`

// ParsePolicy decodes an audit policy strictly.
func ParsePolicy(data []byte) (*auditv1.Policy, error) {
	var p auditv1.Policy
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return nil, err
	}
	if p.APIVersion != "audit.k8s.io/v1" || p.Kind != "Policy" {
		return nil, fmt.Errorf("not an audit.k8s.io/v1 Policy (apiVersion %q, kind %q)", p.APIVersion, p.Kind)
	}
	if len(p.Rules) == 0 {
		return nil, errors.New("a policy without rules logs nothing")
	}
	return &p, nil
}

// Prepare writes the default policy when none is there, checks the one
// that is, and makes the log's directory. It returns the policy's path.
func Prepare(l datadir.Layout, logPath string, log *slog.Logger) (string, error) {
	path := l.AuditPolicy()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		data = []byte(DefaultPolicy)
		if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
			return "", err
		}
	} else if err != nil {
		return "", err
	}
	if _, err := ParsePolicy(data); err != nil {
		return "", fmt.Errorf("--audit-log: the audit policy %s: %w; fix it, or remove it to get the default policy back", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return "", fmt.Errorf("--audit-log %q: %w", logPath, err)
	}
	log.Info("audit log on", "log", logPath, "policy", path,
		"rotation", fmt.Sprintf("%d MB, %d backups, %d days", MaxSizeMB, MaxBackups, MaxAgeDays))
	return path, nil
}
