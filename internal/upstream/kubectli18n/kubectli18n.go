// Package kubectli18n loads kubectl's translations only in `k3sm kubectl`.
// kubectl's packages translate their help texts at package initialisation,
// which every process of the binary runs: the apiserver, the node, each
// child. Loading the catalogue there cost each process ~4 MB of
// allocations, ~1 MB kept and tens of milliseconds of start-up for text
// only kubectl prints. cmd/k3sm imports this package; Go initialises
// it before kubectl's command packages (its import path sorts first and it
// depends only on kubectl's i18n package), as SetLoadTranslationsFunc asks.
package kubectli18n

import (
	"os"

	"k8s.io/kubectl/pkg/util/i18n"
)

func init() {
	// An error means a package translated before this ran: the e2e test
	// TestKubectlTranslationsOnlyInKubectl reports it.
	_ = i18n.SetLoadTranslationsFunc(func() error {
		if len(os.Args) > 1 && os.Args[1] == "kubectl" {
			return i18n.LoadTranslations("kubectl", nil)
		}
		return nil // untranslated: the texts' English defaults
	})
}
