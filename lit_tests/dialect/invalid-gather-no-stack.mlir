// RUN: not stageml-opt %s 2>&1 | filecheck %s

// bt.gather requires `stack`: a gather does not say by default which stack
// (adapter slots or the value's leading dimension) its ids index.

func.func @main(%arg0: !torch.vtensor<[4,8],f32>, %arg1: !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,8],f32> attributes {bt.program = "main"} {
  // CHECK: stageml-opt: error: Unable to parse module assembly:
  // CHECK-NEXT: error: "{{.*}}":[[# @LINE + 1]]:8: 'bt.gather' op attribute "stack" is expected but not provided
  %0 = "bt.gather"(%arg0, %arg1) {from = #bt.time<"adapter">, to = #bt.time<"dynamic">, name = "adapter.0"} : (!torch.vtensor<[4,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,8],f32>
  return %0 : !torch.vtensor<[?,4,8],f32>
}
// CHECK-NOT: Traceback
