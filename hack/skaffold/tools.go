//go:build tools

// The module `make skaffold` builds skaffold from (hack/skaffold/build.sh). Its go.mod pins
// skaffold and copies skaffold's own replace directives, which Go does not take from a dependency.
package tools

import _ "github.com/GoogleContainerTools/skaffold/v2/cmd/skaffold"
