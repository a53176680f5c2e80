package guest

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// FieldError names the value that was refused and how to fix it.
type FieldError struct {
	Field, Value, Msg, Fix string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s %q: %s (fix: %s)", e.Field, e.Value, e.Msg, e.Fix)
}

var (
	versionRe     = regexp.MustCompile(`^v[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$`)
	pathRe        = regexp.MustCompile(`^(/[A-Za-z0-9._-]+)+$`)
	debVersionRe  = regexp.MustCompile(`^[0-9]+:[0-9A-Za-z.+~-]+$`)
	sha256Re      = regexp.MustCompile(`^[a-f0-9]{64}$`)
	fingerprintRe = regexp.MustCompile(`^[A-F0-9]{40}$`)
)

// ValidateCIDR parses an IPv4 network address in CIDR form (host bits zero).
func ValidateCIDR(field, cidr string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() || p.Masked() != p {
		return netip.Prefix{}, &FieldError{field, cidr, "is not an IPv4 network in CIDR form", "use a network address such as 172.30.0.0/16"}
	}
	return p, nil
}

// ValidatePort accepts a TCP port 1-65535.
func ValidatePort(field string, port int) error {
	if port < 1 || port > 65535 {
		return &FieldError{field, fmt.Sprint(port), "is not a TCP port", "use a number between 1 and 65535"}
	}
	return nil
}

// ValidateVersion accepts a release tag vX.Y.Z.
func ValidateVersion(field, v string) error {
	if !versionRe.MatchString(v) {
		return &FieldError{field, v, "is not a release version", "use the form v1.2.3"}
	}
	return nil
}

// ValidatePath accepts a clean absolute path of safe characters.
func ValidatePath(field, p string) error {
	if !pathRe.MatchString(p) || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") || strings.Contains(p, "/./") {
		return &FieldError{field, p, "is not a clean absolute path", "use letters, digits, '.', '_', '-' and '/', e.g. /var/lib/klimax/registry-cache"}
	}
	return nil
}
