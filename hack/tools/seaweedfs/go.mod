// Pins SeaweedFS (Apache-2.0), whose S3 gateway is the object store of the trainer tier's and the
// kind cluster's checkpoint tests (hack/build-tools.sh seaweedfs). The server is built from the
// module's own directory with its own go.mod, as its releases are; this go.sum verifies the module.
module ebbflow.dev/hack/tools/seaweedfs

go 1.26.0

require github.com/seaweedfs/seaweedfs v0.0.0-20261109003541-7506e5f91cd6
