package wire

import (
	"strings"
	"testing"
)

func TestParseRanges(t *testing.T) {
	ok := []ConfigureArgs{
		{PodCIDR: "100.64.0.0/24"},
		{PodCIDR: "100.64.0.0/24", ServiceCIDR: "10.43.0.0/16", ClusterCIDR: "100.64.0.0/10"},
		{PodCIDR: "100.64.0.0/24", ClusterCIDR: "100.64.0.0/24"},
	}
	for _, a := range ok {
		if _, _, _, err := ParseRanges(&a); err != nil {
			t.Errorf("%+v: %v", a, err)
		}
	}
	bad := map[string]ConfigureArgs{
		"serviceCIDR: \"x\" is not a CIDR":                   {PodCIDR: "100.64.0.0/24", ServiceCIDR: "x"},
		"serviceCIDR: 10.43.0.1/16 has host bits":            {PodCIDR: "100.64.0.0/24", ServiceCIDR: "10.43.0.1/16"},
		"clusterCIDR: 10.0.0.0/7 is larger than a /8":        {PodCIDR: "100.64.0.0/24", ClusterCIDR: "10.0.0.0/7"},
		"clusterCIDR: 100.65.0.0/16 does not contain":        {PodCIDR: "100.64.0.0/24", ClusterCIDR: "100.65.0.0/16"},
		"serviceCIDR: 100.64.0.0/16 overlaps the pod ranges": {PodCIDR: "100.64.0.0/24", ServiceCIDR: "100.64.0.0/16"},
		"serviceCIDR: 127.0.0.0/8 overlaps the reserved":     {PodCIDR: "100.64.0.0/24", ServiceCIDR: "127.0.0.0/8"},
		"serviceCIDR: fd00::/64 is not IPv4":                 {PodCIDR: "100.64.0.0/24", ServiceCIDR: "fd00::/64"},
	}
	for want, a := range bad {
		_, _, _, err := ParseRanges(&a)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want %q", a, err, want)
		}
		r := &Request{Version: Version, Verb: VerbConfigure, Configure: &a}
		if r.Validate() == nil {
			t.Errorf("%+v: Validate accepted it", a)
		}
	}
}
