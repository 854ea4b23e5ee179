// RUN: not stageml-opt %s 2>&1 | filecheck %s

// bt.lift requires `from`, `to` and `name`; `from` must be a #bt.time.

func.func @main(%arg0: !torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32> attributes {bt.program = "main"} {
  // CHECK: error: "{{.*}}":[[# @LINE + 1]]:8: expected base attribute 'bt.time' but got 'builtin.string'
  %0 = "bt.lift"(%arg0) {from = "static", to = #bt.time<"dynamic">, name = "w"} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
  return %0 : !torch.vtensor<[4,8],f32>
}
// CHECK-NOT: Traceback
