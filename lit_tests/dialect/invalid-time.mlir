// RUN: not stageml-opt %s 2>&1 | filecheck %s

// #bt.time takes one of "static", "adapter", "dynamic".

// CHECK: stageml-opt: error: Unable to parse module assembly:
// CHECK-NEXT: error: "{{.*}}":[[# @LINE + 1]]:65: '"later"' does not satisfy the constraint
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.time = #bt.time<"later">}) -> !torch.vtensor<[4,8],f32> attributes {bt.program = "main"} {
  return %arg0 : !torch.vtensor<[4,8],f32>
}
// CHECK-NOT: Traceback
