// Command etcd is etcd's own server main (go.etcd.io/etcd/server/v3/etcdmain)
// built from this module, so the klimax node image gets an etcd at the
// version go.mod pins without downloading a release.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
