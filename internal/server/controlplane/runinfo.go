package controlplane

import (
	"encoding/json"
	"os"
	goruntime "runtime"
	"time"

	"github.com/k3sm-dev/k3sm/internal/atomicfile"
	"github.com/k3sm-dev/k3sm/internal/datadir"
	"github.com/k3sm-dev/k3sm/internal/version"
)

// RunInfo is <data-dir>/run/server.json: what a running server listens on
// and serves, so `k3sm status` probes the ports it was started with rather
// than the defaults. It exists only while the server runs.
type RunInfo struct {
	Pid                   int       `json:"pid"`
	Started               time.Time `json:"started"`
	Version               string    `json:"version"`
	APIURL                string    `json:"apiURL"`
	SchedulerPort         int       `json:"schedulerPort"`
	ControllerManagerPort int       `json:"controllerManagerPort"`
	KubeletPort           int       `json:"kubeletPort"`
	NodeName              string    `json:"nodeName"`
	ServiceCIDR           string    `json:"serviceCIDR"`
	ClusterDNS            string    `json:"clusterDNS"`
	ClusterDomain         string    `json:"clusterDomain"`
	// ServiceProxy is the mode in force: "nftables" or "userspace".
	ServiceProxy string `json:"serviceProxy,omitempty"`
	// NetdSocket is the k3sm-netd run apart (--netd-socket), if any.
	NetdSocket string `json:"netdSocket,omitempty"`
	// MeshPort is the node's mesh device's UDP port (0: no mesh).
	MeshPort int `json:"meshPort,omitempty"`
	// Datastore is the datastore's endpoint without its password.
	Datastore string `json:"datastore,omitempty"`
	// DisableAgent: the server runs no node of its own (--disable-agent).
	DisableAgent bool `json:"disableAgent,omitempty"`
}

func (c *Config) runInfo(started time.Time) RunInfo {
	return RunInfo{Pid: os.Getpid(), Started: started.UTC(), Version: version.Version, APIURL: c.LocalAPIURL(),
		SchedulerPort: c.SchedulerPort, ControllerManagerPort: c.ControllerManagerPort, KubeletPort: c.KubeletPort,
		NodeName: c.NodeName, ServiceCIDR: c.ServiceCIDR, ClusterDNS: c.ClusterDNS, ClusterDomain: c.ClusterDomain,
		ServiceProxy: ServiceProxyMode(c.ServiceProxy, goruntime.GOOS, c.NetdAvailable(os.Geteuid()), c.PodNetwork), NetdSocket: c.NetdSocket,
		MeshPort: c.MeshPort, Datastore: c.Datastore.Redacted(), DisableAgent: c.DisableAgent}
}

func writeRunInfo(l datadir.Layout, ri RunInfo) error {
	data, err := json.MarshalIndent(ri, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(l.ServerInfoFile(), append(data, '\n'), 0o644)
}

// ReadRunInfo reads the running server's server.json.
func ReadRunInfo(dataDir string) (RunInfo, error) {
	var ri RunInfo
	data, err := os.ReadFile(datadir.New(dataDir).ServerInfoFile())
	if err != nil {
		return ri, err
	}
	return ri, json.Unmarshal(data, &ri)
}

// ServiceProxyMode resolves --service-proxy for a pod network mode: the
// kernel path ("nftables") needs k3sm-netd, which runs as root on Linux
// unless --pod-network=host. The config check refused unknown modes; an
// impossible "nftables" is refused when the node starts.
func ServiceProxyMode(mode, goos string, netdAvailable bool, podNetwork string) string {
	netd := goos == "linux" && netdAvailable && podNetwork != "host"
	if mode == "userspace" || (!netd && mode != "nftables") {
		return "userspace"
	}
	return "nftables"
}
