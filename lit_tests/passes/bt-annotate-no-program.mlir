// RUN: not stageml-opt %s -p bt-annotate 2>&1 | filecheck %s

// The torch-side passes run on program functions: a func.func with
// bt.program ("main" or "factorized"), as the StageML frontend imports it.
// A module without one is an error, not silently left alone.

// CHECK: stageml-opt: error: the module has no program function (a func.func with bt.program): import the model with the StageML frontend
// CHECK-NOT: Traceback
// CHECK-NOT: module
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight"}) -> !torch.vtensor<[4,8],f32> {
  return %arg0 : !torch.vtensor<[4,8],f32>
}
