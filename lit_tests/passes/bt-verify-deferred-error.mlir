// RUN: not stageml-opt %s -p bt-verify 2>&1 | filecheck %s

// bt.deferred lets an op recompute earlier-stage work on every call only where
// it is a widening cast of an integer weight (defer-dequant). Here it marks
// the product of two static matrices, which bt-propagate made static and
// bt-split would fold: the verifier refuses it.

func.func @main(%arg0: !torch.vtensor<[8,16],f32> {bt.name = "p", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,4],f32> {bt.name = "q", bt.time = #bt.time<"static">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,4],f32> attributes {bt.program = "main"} {
  // CHECK: stageml-opt: error: bt-verify: loc("{{.*}}":[[# @LINE + 1]]:8): 'torch.aten.mm' is marked bt.deferred, which only a widening cast of an integer tensor may be (defer-dequant)
  %0 = torch.aten.mm %arg0, %arg1 {bt.deferred, bt.time = #bt.time<"dynamic">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[16,4],f32> -> !torch.vtensor<[8,4],f32>
  %1 = torch.aten.matmul %arg2, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  return %1 : !torch.vtensor<[?,4],f32>
}
// CHECK-NOT: Traceback
