// Package datadir owns the layout of k3sm's data directory: every path
// under it is named here, and the server, the agent and the runtime ask for
// them here instead of joining names of their own. It imports nothing but
// the standard library, so the shim and netd may use it.
//
//	<data-dir>/
//	  k3sm.lock             one server per data dir
//	  registries.yaml       image registry mirrors and credentials (optional)
//	  admin.kubeconfig      cluster-admin credential
//	  logs/                 component logs; logs/pods/ the CRI container logs
//	  run/                  sockets: runtime.sock, shims/, runtimed.lock, netd.sock, role configs;
//	                        server.json, components.json (the running server, for `k3sm status`);
//	                        netns/<uid> the pods' network namespaces (k3sm-netd)
//	  server/               control plane: db/state.db, tls/, cred/, flexvolume/, kine.sock,
//	                        snapshots/, audit-policy.yaml, manifests/ (auto-deploy)
//	                        (the audit log is logs/audit.log)
//	  agent/                the node: its kubeconfigs, tls/, runtime-events.json, netd-state.json
//	  pods/<uid>/           a pod (the runtime daemon): pod.json, resolv.conf, roots/<container>/,
//	                        volumes/<name>/, attempts/<container>/<n>/
//	  seccomp/              Localhost seccomp profiles
//	  images/               the image store (the runtime daemon)
//	    registry/           the node registry's journal of pushed manifests
//	  storage/              local-path PersistentVolumes
//	  quarantine/           what is left of pods whose state could not be read
package datadir

import (
	"path/filepath"
	"strconv"
)

// Layout names the files under one data directory. The zero value is
// unusable; Root must be set (it may be relative).
type Layout struct{ Root string }

// New returns the layout of the data directory root.
func New(root string) Layout { return Layout{Root: root} }

// Top level.
func (l Layout) LockFile() string        { return filepath.Join(l.Root, "k3sm.lock") }
func (l Layout) AdminKubeconfig() string { return filepath.Join(l.Root, "admin.kubeconfig") }
func (l Layout) LogDir() string          { return filepath.Join(l.Root, "logs") }
func (l Layout) ServerLog() string       { return filepath.Join(l.LogDir(), "k3sm.log") }
func (l Layout) RunDir() string          { return filepath.Join(l.Root, "run") }

// RegistriesFile is the default registries.yaml (mirrors, auth, TLS).
func (l Layout) RegistriesFile() string { return filepath.Join(l.Root, "registries.yaml") }

// RoleConfig is the typed configuration the supervisor hands a child role
// (see internal/roleconfig).
func (l Layout) RoleConfig(role string) string { return filepath.Join(l.RunDir(), role+".json") }

// ServerInfoFile describes the running server (its pid, ports, node) and
// ComponentsFile its supervisor's children; both exist only while a server
// runs and are read by `k3sm status`.
func (l Layout) ServerInfoFile() string { return filepath.Join(l.RunDir(), "server.json") }
func (l Layout) ComponentsFile() string { return filepath.Join(l.RunDir(), "components.json") }

// Server side: the control plane.
func (l Layout) ServerDir() string { return filepath.Join(l.Root, "server") }
func (l Layout) DBDir() string     { return filepath.Join(l.ServerDir(), "db") }
func (l Layout) DBFile() string    { return filepath.Join(l.DBDir(), "state.db") }

// EtcdDir is the embedded etcd member's data (--cluster-init).
func (l Layout) EtcdDir() string { return filepath.Join(l.DBDir(), "etcd") }

// EtcdRestoreFile is an etcd snapshot `k3sm snapshot restore` placed for
// the next start, which loads it into a new single member.
func (l Layout) EtcdRestoreFile() string { return filepath.Join(l.DBDir(), "etcd-restore.db") }
func (l Layout) TLSDir() string          { return filepath.Join(l.ServerDir(), "tls") }
func (l Layout) TLS(name string) string  { return filepath.Join(l.TLSDir(), name) }
func (l Layout) CredDir() string         { return filepath.Join(l.ServerDir(), "cred") }

// Cred is the kubeconfig of one of the server's own clients.
func (l Layout) Cred(name string) string   { return filepath.Join(l.CredDir(), name+".kubeconfig") }
func (l Layout) FlexVolumeDir() string     { return filepath.Join(l.ServerDir(), "flexvolume") }
func (l Layout) ServiceAccountKey() string { return filepath.Join(l.TLSDir(), "service-account.key") }

// KineSocketName is relative to ServerDir, the apiserver's working
// directory: it keeps the unix socket path short.
func (l Layout) KineSocketName() string { return "kine.sock" }
func (l Layout) KineSocket() string     { return filepath.Join(l.ServerDir(), l.KineSocketName()) }

// DatastoreFile records which datastore holds the cluster (package
// datastore): the embedded SQLite DBFile or an external database.
func (l Layout) DatastoreFile() string { return filepath.Join(l.ServerDir(), "datastore.json") }

// Agent side: the node of this machine.
func (l Layout) AgentDir() string       { return filepath.Join(l.Root, "agent") }
func (l Layout) AgentTLSDir() string    { return filepath.Join(l.AgentDir(), "tls") }
func (l Layout) NodeKubeconfig() string { return filepath.Join(l.AgentDir(), "node.kubeconfig") }
func (l Layout) KubeletServingCert() string {
	return filepath.Join(l.AgentTLSDir(), "serving-kubelet.crt")
}
func (l Layout) KubeletServingKey() string {
	return filepath.Join(l.AgentTLSDir(), "serving-kubelet.key")
}
func (l Layout) KubeletClientCA() string { return filepath.Join(l.AgentTLSDir(), "client-ca.crt") }

// A node that joined a server (k3sm agent): the client certificate and key
// its kubeconfig holds, the CA it trusts the servers by, its password (the
// server stores only a hash), and the cluster settings the join returned.
func (l Layout) NodeClientCert() string   { return filepath.Join(l.AgentTLSDir(), "client-kubelet.crt") }
func (l Layout) NodeClientKey() string    { return filepath.Join(l.AgentTLSDir(), "client-kubelet.key") }
func (l Layout) AgentServerCA() string    { return filepath.Join(l.AgentTLSDir(), "server-ca.crt") }
func (l Layout) NodePasswordFile() string { return filepath.Join(l.AgentDir(), "node-password") }
func (l Layout) JoinFile() string         { return filepath.Join(l.AgentDir(), "join.json") }

// APIServersFile is the agent's load balancer's last known list of the
// cluster's apiservers (package apilb).
func (l Layout) APIServersFile() string { return filepath.Join(l.AgentDir(), "apiservers.json") }

// The joined node's local-path provisioner's client certificate and key
// (the server's own node has its pair under the same names).
func (l Layout) LocalPathClientCert() string {
	return filepath.Join(l.AgentTLSDir(), "client-local-path.crt")
}
func (l Layout) LocalPathClientKey() string {
	return filepath.Join(l.AgentTLSDir(), "client-local-path.key")
}
func (l Layout) LocalPathKubeconfig() string {
	return filepath.Join(l.AgentDir(), "local-path.kubeconfig")
}

// RuntimeEventsFile is where the node keeps how far it has read the
// runtime daemon's event stream.
func (l Layout) RuntimeEventsFile() string { return filepath.Join(l.AgentDir(), "runtime-events.json") }

// StorageDir holds the local-path PersistentVolumes' directories.
func (l Layout) StorageDir() string { return filepath.Join(l.Root, "storage") }

// NodeStartGate exists once the server has verified authorization; the
// node waits for it (roleconfig.NodeConfig.StartGate).
func (l Layout) NodeStartGate() string { return filepath.Join(l.RunDir(), "node-start-gate") }

// Runtime daemon.
func (l Layout) RuntimeSocket() string { return filepath.Join(l.RunDir(), "runtime.sock") }
func (l Layout) RuntimeLock() string   { return filepath.Join(l.RunDir(), "runtimed.lock") }
func (l Layout) ShimDir() string       { return filepath.Join(l.RunDir(), "shims") }
func (l Layout) PodsDir() string       { return filepath.Join(l.Root, "pods") }

// SeccompDir holds the node's seccomp profiles: a container's
// `seccompProfile: {type: Localhost, localhostProfile: p}` is SeccompDir/p
// (the kubelet's /var/lib/kubelet/seccomp).
func (l Layout) SeccompDir() string { return filepath.Join(l.Root, "seccomp") }
func (l Layout) PodDir(uid string) string {
	return filepath.Join(l.PodsDir(), uid)
}
func (l Layout) ImagesDir() string { return filepath.Join(l.Root, "images") }

// RegistryJournalDir holds the node-local registry's journal of pushed
// manifests that are no image of the store (indexes, digest-only pushes).
func (l Layout) RegistryJournalDir() string { return filepath.Join(l.ImagesDir(), "registry") }

// k3sm-netd, the root network helper: its socket, the pods' addresses, and
// the pods' network namespace files.
func (l Layout) NetdSocket() string    { return filepath.Join(l.RunDir(), "netd.sock") }
func (l Layout) NetdStateFile() string { return filepath.Join(l.AgentDir(), "netd-state.json") }
func (l Layout) NetNSDir() string      { return filepath.Join(l.RunDir(), "netns") }
func (l Layout) PodNetNS(uid string) string {
	return filepath.Join(l.NetNSDir(), uid)
}

// Inside a pod's directory: its state, each container's root, its volumes,
// and each container start attempt's state (attempts/<container>/<n>).
func (l Layout) PodStateFile(uid string) string { return filepath.Join(l.PodDir(uid), "pod.json") }

// PodResolvConf is the pod's /etc/resolv.conf, bound over it in every
// container.
func (l Layout) PodResolvConf(uid string) string { return filepath.Join(l.PodDir(uid), "resolv.conf") }
func (l Layout) PodRootDir(uid, container string) string {
	return filepath.Join(l.PodDir(uid), "roots", container)
}
func (l Layout) PodVolumeDir(uid, volume string) string {
	return filepath.Join(l.PodDir(uid), "volumes", volume)
}
func (l Layout) PodAttemptsDir(uid string) string { return filepath.Join(l.PodDir(uid), "attempts") }
func (l Layout) PodAttemptDir(uid, container string, attempt int) string {
	return filepath.Join(l.PodAttemptsDir(uid), container, strconv.Itoa(attempt))
}

// PodLogsDir holds the CRI container logs, one directory per pod named
// <namespace>_<name>_<uid> as the kubelet does.
func (l Layout) PodLogsDir() string { return filepath.Join(l.LogDir(), "pods") }
func (l Layout) PodLogDir(namespace, name, uid string) string {
	return filepath.Join(l.PodLogsDir(), namespace+"_"+name+"_"+uid)
}
func (l Layout) QuarantineDir() string { return filepath.Join(l.Root, "quarantine") }

// Operations (docs/operations.md): snapshots, secrets encryption, the audit log.
func (l Layout) SnapshotsDir() string { return filepath.Join(l.ServerDir(), "snapshots") }
func (l Layout) EncryptionConfig() string {
	return filepath.Join(l.CredDir(), "encryption-config.yaml")
}
func (l Layout) AuditPolicy() string { return filepath.Join(l.ServerDir(), "audit-policy.yaml") }
func (l Layout) AuditLog() string    { return filepath.Join(l.LogDir(), "audit.log") }

// ManifestsDir is the auto-deploy folder: every manifest in it is applied
// by the server (internal/server/deploy).
func (l Layout) ManifestsDir() string { return filepath.Join(l.ServerDir(), "manifests") }

// DBSidecars are SQLite's WAL and shared-memory files next to DBFile.
func (l Layout) DBSidecars() []string { return []string{l.DBFile() + "-wal", l.DBFile() + "-shm"} }
