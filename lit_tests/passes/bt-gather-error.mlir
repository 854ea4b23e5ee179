// RUN: not stageml-opt %s -p bt-gather 2>&1 | filecheck %s

// Only products x @ W with an adapter-time W can be served per request
// row: adapter state added to the request's activations cannot.

func.func @main_factorized(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">}, %arg1: !torch.vtensor<[?,4,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,4,8],f32> attributes {bt.program = "factorized"} {
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = "bt.lift"(%arg0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "fc.delta", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
  // CHECK: stageml-opt: error: loc("{{.*}}":[[# @LINE + 1]]:8): adapter state 'fc.delta' is used by 'torch.aten.add.Tensor', which cannot be served per request row; only products x @ W with an adapter-time W can
  %1 = torch.aten.add.Tensor %arg1, %0, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4,8],f32>, !torch.vtensor<[4,8],f32>, !torch.int -> !torch.vtensor<[?,4,8],f32>
  return %1 : !torch.vtensor<[?,4,8],f32>
}
// CHECK-NOT: Traceback
// CHECK-NOT: module
