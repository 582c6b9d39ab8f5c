// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at the
// version pinned in ../../go.mod. The etcd repository's own main lives in its
// root module (go.etcd.io/etcd/v3), which drags in etcdctl/etcdutl and their
// dependencies; calling etcdmain directly builds only the server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
