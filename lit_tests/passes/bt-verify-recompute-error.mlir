// RUN: not stageml-opt %s -p bt-verify 2>&1 | filecheck %s

// No recomputation: the expert stack's transpose is static work (it reads
// only the lifted static stack), but it is marked dynamic, so every request
// would redo it; bt-propagate would have made it static (and bt-lift lifted
// its result instead).

func.func @main(%arg0: !torch.vtensor<[4,8,16],f32> {bt.name = "experts.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[?,1,16],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg2: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,8],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %int2 = torch.constant.int 2 {bt.time = #bt.time<"static">}
  %0 = "bt.lift"(%arg0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "experts.weight", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,8,16],f32>) -> !torch.vtensor<[4,8,16],f32>
  // CHECK: stageml-opt: error: bt-verify: loc("{{.*}}":[[# @LINE + 1]]:8): 'torch.aten.transpose.int' is dynamic but only reads static values: it would recompute earlier-stage work on every call
  %1 = torch.aten.transpose.int %0, %int1, %int2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,8,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,16,8],f32>
  %2 = torch.aten.index_select %1, %int0, %arg2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,16,8],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,16,8],f32>
  %3 = torch.aten.matmul %arg1, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,16],f32>, !torch.vtensor<[?,16,8],f32> -> !torch.vtensor<[?,1,8],f32>
  return %3 : !torch.vtensor<[?,1,8],f32>
}
// CHECK-NOT: Traceback
// CHECK-NOT: module
