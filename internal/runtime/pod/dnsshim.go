package pod

// DNSShimLibName is the getaddrinfo interposer of the darwin design: macOS
// resolves names through mDNSResponder and never reads /etc/resolv.conf,
// so a pod finds the cluster DNS only through a library injected with
// DYLD_INSERT_LIBRARIES that answers getaddrinfo from the pod's own
// resolver configuration. It is a darwin build artifact (not built yet);
// what it is given is fixed here.
const DNSShimLibName = "libk3sm-dns.dylib"

// ResolvConfEnv names the variable that tells the interposer where the
// pod's resolver configuration is: a file in resolv.conf syntax
// (nameserver, search, options ndots:N), the same file Linux pods see as
// /etc/resolv.conf.
const ResolvConfEnv = "K3SM_RESOLV_CONF"

// dnsShimEnv is what a darwin container's environment gets: the library
// to insert, and the file it reads.
func dnsShimEnv(lib, resolvConf string) []string {
	return []string{"DYLD_INSERT_LIBRARIES=" + lib, ResolvConfEnv + "=" + resolvConf}
}
