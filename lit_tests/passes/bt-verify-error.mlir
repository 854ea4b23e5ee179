// RUN: not stageml-opt %s -p bt-verify 2>&1 | filecheck %s

// Congruence: an op may not be earlier than its operands. The matmul is
// marked static but reads the request-time input x.

func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,4],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  // CHECK: stageml-opt: error: bt-verify: loc("{{.*}}":[[# @LINE + 1]]:8): 'torch.aten.matmul' is static but uses a dynamic operand
  %1 = torch.aten.matmul %arg1, %0 {bt.time = #bt.time<"static">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  return %1 : !torch.vtensor<[?,4],f32>
}
// CHECK-NOT: Traceback
// CHECK-NOT: module
