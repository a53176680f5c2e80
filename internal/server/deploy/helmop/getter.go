package helmop

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// restGetter hands helm the server's own admin config, with discovery cached
// in memory: the k3sm user's home may not exist, so nothing goes to
// ~/.kube/cache.
type restGetter struct {
	rc        *rest.Config
	namespace string
	dc        discovery.CachedDiscoveryInterface
}

var _ genericclioptions.RESTClientGetter = (*restGetter)(nil)

func newGetter(rc *rest.Config, namespace string) *restGetter {
	return &restGetter{rc: rc, namespace: namespace}
}

func (g *restGetter) ToRESTConfig() (*rest.Config, error) { return rest.CopyConfig(g.rc), nil }

func (g *restGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	if g.dc == nil {
		dc, err := discovery.NewDiscoveryClientForConfig(g.rc)
		if err != nil {
			return nil, err
		}
		g.dc = memory.NewMemCacheClient(dc)
	}
	return g.dc, nil
}

func (g *restGetter) ToRESTMapper() (meta.RESTMapper, error) {
	dc, err := g.ToDiscoveryClient()
	if err != nil {
		return nil, err
	}
	return restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(dc), dc, nil), nil
}

// ToRawKubeConfigLoader only carries the namespace: helm asks it for the
// namespace of objects that name none.
func (g *restGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	cfg := clientcmdapi.NewConfig()
	return clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: g.namespace}})
}
