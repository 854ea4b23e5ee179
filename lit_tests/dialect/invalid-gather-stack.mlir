// RUN: not stageml-opt %s 2>&1 | filecheck %s

// bt.gather's `stack` names the stack its ids index: "slots" (the per-slot
// copies of the value) or "leading" (the value's own leading dimension).

func.func @main(%arg0: !torch.vtensor<[4,8],f32>, %arg1: !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,8],f32> attributes {bt.program = "main"} {
  // CHECK: stageml-opt: error: Unable to parse module assembly:
  // CHECK-NEXT: error: "{{.*}}":[[# @LINE + 2]]:8: '"rows"' does not satisfy the constraint
  // CHECK-NEXT: note: "{{.*}}":[[# @LINE + 1]]:8: see current operation: %0 = "bt.gather"(%arg0, %arg1)
  %0 = "bt.gather"(%arg0, %arg1) {from = #bt.time<"adapter">, to = #bt.time<"dynamic">, name = "adapter.0", stack = "rows"} : (!torch.vtensor<[4,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,8],f32>
  return %0 : !torch.vtensor<[?,4,8],f32>
}
// CHECK-NOT: Traceback
