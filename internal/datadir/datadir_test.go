package datadir

import "testing"

// The layout is a contract with data dirs made by earlier versions: a path
// that moves loses the cluster's state, credentials or pods on upgrade.
func TestLayoutIsStable(t *testing.T) {
	l := New("/d")
	for got, want := range map[string]string{
		l.LockFile(): "/d/k3sm.lock", l.RegistriesFile(): "/d/registries.yaml", l.AdminKubeconfig(): "/d/admin.kubeconfig", l.ServerLog(): "/d/logs/k3sm.log",
		l.RoleConfig("node"): "/d/run/node.json", l.DBFile(): "/d/server/db/state.db", l.DatastoreFile(): "/d/server/datastore.json", l.TLS("x"): "/d/server/tls/x",
		l.Cred("admin"): "/d/server/cred/admin.kubeconfig", l.FlexVolumeDir(): "/d/server/flexvolume",
		l.ServiceAccountKey(): "/d/server/tls/service-account.key", l.KineSocket(): "/d/server/kine.sock",
		l.NodeKubeconfig(): "/d/agent/node.kubeconfig", l.KubeletServingCert(): "/d/agent/tls/serving-kubelet.crt",
		l.KubeletServingKey(): "/d/agent/tls/serving-kubelet.key", l.KubeletClientCA(): "/d/agent/tls/client-ca.crt",
		l.LocalPathKubeconfig(): "/d/agent/local-path.kubeconfig", l.RuntimeEventsFile(): "/d/agent/runtime-events.json",
		l.StorageDir(): "/d/storage", l.RuntimeSocket(): "/d/run/runtime.sock", l.RuntimeLock(): "/d/run/runtimed.lock",
		l.ShimDir(): "/d/run/shims", l.PodDir("u"): "/d/pods/u", l.ImagesDir(): "/d/images",
		l.PodStateFile("u"): "/d/pods/u/pod.json", l.PodResolvConf("u"): "/d/pods/u/resolv.conf", l.PodRootDir("u", "c"): "/d/pods/u/roots/c",
		l.PodVolumeDir("u", "v"): "/d/pods/u/volumes/v", l.PodAttemptDir("u", "c", 3): "/d/pods/u/attempts/c/3",
		l.PodLogDir("ns", "p", "u"): "/d/logs/pods/ns_p_u", l.QuarantineDir(): "/d/quarantine",
		l.SnapshotsDir(): "/d/server/snapshots", l.EncryptionConfig(): "/d/server/cred/encryption-config.yaml",
		l.AuditPolicy(): "/d/server/audit-policy.yaml", l.AuditLog(): "/d/logs/audit.log",
		l.ManifestsDir():  "/d/server/manifests",
		l.DBSidecars()[0]: "/d/server/db/state.db-wal", l.DBSidecars()[1]: "/d/server/db/state.db-shm",
		l.NetdSocket(): "/d/run/netd.sock", l.NetdStateFile(): "/d/agent/netd-state.json",
		l.NetNSDir(): "/d/run/netns", l.PodNetNS("u"): "/d/run/netns/u",
		l.ServerInfoFile(): "/d/run/server.json", l.ComponentsFile(): "/d/run/components.json",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}
