// RUN: stageml-opt %s -p bt-gather | filecheck %s
// RUN: stageml-opt %s -p bt-gather,bt-verify | filecheck %s --check-prefix=VERIFY

// Per-tenant expert LoRA after bt-lift and bt-stacks (expert-factors' form):
// the per-expert factors [E, in, R] and [E, R, out] are adapter state
// selected by the routed expert ids. Each becomes a bt.gather of entries
// (stack = "slot_entries") by slot·E + e, the slot that of the request row
// each routed row comes from (rows / request rows of them per request row,
// in order; any other count fails the call); both factors share the entry ids. The static base stack keeps
// its leading gather.

// CHECK-LABEL: func.func @main_factorized
// CHECK-SAME:    %arg5: !torch.vtensor<[?],si64> {bt.name = "adapter_ids", bt.time = #bt.time<"dynamic">}
// CHECK:         "bt.gather"(%{{[0-9]+}}, %arg4) {{.*}}stack = "leading"
// CHECK:         %[[N:[0-9]+]] = torch.aten.size.int %arg4
// CHECK:         %[[B:[0-9]+]] = torch.aten.size.int %arg5
// CHECK:         %[[PER:[0-9]+]] = torch.aten.floordiv.int %[[N]], %[[B]]
// CHECK:         torch.runtime.assert %{{[0-9]+}}, "a LoRA site's input rows do not line up with the request rows
// CHECK:         %[[COL:[0-9]+]] = torch.aten.unsqueeze %arg5
// CHECK:         %[[SIZES:[0-9]+]] = torch.prim.ListConstruct %[[B]], %[[PER]]
// CHECK:         %[[ONES:[0-9]+]] = torch.aten.ones %[[SIZES]]
// CHECK:         %[[SPREAD:[0-9]+]] = torch.aten.mul.Tensor %[[COL]], %[[ONES]]
// CHECK:         %[[SLOTS:[0-9]+]] = torch.aten.flatten.using_ints %[[SPREAD]]
// CHECK:         %[[SE:[0-9]+]] = torch.aten.mul.Scalar %[[SLOTS]], %int4
// CHECK:         %[[IDS:[0-9]+]] = torch.aten.add.Tensor %[[SE]], %arg4
// CHECK:         %[[GA:[0-9]+]] = "bt.gather"(%{{[0-9]+}}, %[[IDS]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.0", stack = "slot_entries", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,6,4],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,6,4],f32>
// CHECK:         torch.aten.bmm %arg3, %[[GA]]
// CHECK:         "bt.gather"(%{{[0-9]+}}, %[[IDS]]) {{.*}}name = "factorized.adapter.1", stack = "slot_entries"{{.*}} -> !torch.vtensor<[?,4,12],f32>
// CHECK-NOT:     "bt.lift"(%{{[0-9]+}}) {{.*}}from = #bt.time<"adapter">
// CHECK:         return

// VERIFY-LABEL: func.func @main_factorized
// VERIFY:         stack = "slot_entries"
module attributes {bt.sites = [{dtype = "float32", experts = 4 : i64, in_features = 6 : i64, lora_A = "experts.lora_A.default.weight", lora_B = "experts.lora_B.default.weight", out_features = 12 : i64, rank = 2 : i64, scaling = 2.000000e+00 : f64}], bt.tenants = {max_adapters = 2 : i64, max_rank = 4 : i64}} {
  func.func @main(%arg0: !torch.vtensor<[4,12,6],f32> {bt.name = "experts.gate_up_proj", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,6],f32> {bt.name = "experts.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[12,16],f32> {bt.name = "experts.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,1,6],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,12],f32> attributes {bt.program = "main"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int2 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %int4 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %int4_0 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %int6 = torch.constant.int 6 {bt.time = #bt.time<"static">}
    %0 = torch.prim.ListConstruct %int4, %int4_0, %int6 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %1 = torch.aten.view %arg1, %0 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,6],f32>, !torch.list<int> -> !torch.vtensor<[4,4,6],f32>
    %int12 = torch.constant.int 12 {bt.time = #bt.time<"static">}
    %int4_1 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %int4_2 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %2 = torch.prim.ListConstruct %int12, %int4_1, %int4_2 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %3 = torch.aten.view %arg2, %2 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,16],f32>, !torch.list<int> -> !torch.vtensor<[12,4,4],f32>
    %int2_3 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %int0_4 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1_5 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %4 = torch.prim.ListConstruct %int2_3, %int0_4, %int1_5 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %5 = torch.aten.permute %3, %4 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,4,4],f32>, !torch.list<int> -> !torch.vtensor<[4,12,4],f32>
    %6 = torch.aten.bmm %5, %1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,4],f32>, !torch.vtensor<[4,4,6],f32> -> !torch.vtensor<[4,12,6],f32>
    %int1_6 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %7 = "bt.lift"(%arg0) {bt.time = #bt.time<"adapter">, from = #bt.time<"static">, name = "experts.gate_up_proj", to = #bt.time<"adapter">} : (!torch.vtensor<[4,12,6],f32>) -> !torch.vtensor<[4,12,6],f32>
    %8 = torch.aten.add.Tensor %7, %6, %int1_6 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.vtensor<[4,12,6],f32>, !torch.int -> !torch.vtensor<[4,12,6],f32>
    %9 = torch.prim.ListConstruct %int0, %int2, %int1 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %10 = torch.aten.permute %8, %9 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.list<int> -> !torch.vtensor<[4,6,12],f32>
    %11 = "bt.gather"(%10, %arg4) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", stack = "leading", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,6,12],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,6,12],f32>
    %12 = torch.aten.bmm %arg3, %11 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,12],f32> -> !torch.vtensor<[?,1,12],f32>
    return %12 : !torch.vtensor<[?,1,12],f32>
  }
  func.func @main_factorized(%arg0: !torch.vtensor<[4,12,6],f32> {bt.name = "experts.gate_up_proj", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,6],f32> {bt.name = "experts.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[12,16],f32> {bt.name = "experts.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,1,6],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,12],f32> attributes {bt.program = "factorized"} {
    %int4 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %int4_0 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %int6 = torch.constant.int 6 {bt.time = #bt.time<"static">}
    %0 = torch.prim.ListConstruct %int4, %int4_0, %int6 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %1 = torch.aten.view %arg1, %0 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,6],f32>, !torch.list<int> -> !torch.vtensor<[4,4,6],f32>
    %int12 = torch.constant.int 12 {bt.time = #bt.time<"static">}
    %int4_1 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %int4_2 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %2 = torch.prim.ListConstruct %int12, %int4_1, %int4_2 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %3 = torch.aten.view %arg2, %2 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,16],f32>, !torch.list<int> -> !torch.vtensor<[12,4,4],f32>
    %int2 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %4 = torch.prim.ListConstruct %int2, %int0, %int1 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %5 = torch.aten.permute %3, %4 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,4,4],f32>, !torch.list<int> -> !torch.vtensor<[4,12,4],f32>
    %int1_3 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int2_4 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %6 = torch.aten.transpose.int %arg0, %int1_3, %int2_4 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,12,6],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,6,12],f32>
    %int1_5 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int2_6 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %7 = torch.aten.transpose.int %1, %int1_5, %int2_6 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,4,6],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,6,4],f32>
    %int1_7 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int2_8 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %8 = torch.aten.transpose.int %5, %int1_7, %int2_8 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,4,12],f32>
    %int0_9 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %9 = "bt.gather"(%6, %arg4) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "factorized.static.0", stack = "leading", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,6,12],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,6,12],f32>
    %10 = torch.aten.bmm %arg3, %9 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,12],f32> -> !torch.vtensor<[?,1,12],f32>
    %int0_10 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %11 = "bt.lift"(%7) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,6,4],f32>) -> !torch.vtensor<[4,6,4],f32>
    %12 = torch.aten.index_select %11, %int0_10, %arg4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,6,4],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,6,4],f32>
    %13 = torch.aten.bmm %arg3, %12 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,4],f32> -> !torch.vtensor<[?,1,4],f32>
    %int0_11 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %14 = "bt.lift"(%8) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.1", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,4,12],f32>) -> !torch.vtensor<[4,4,12],f32>
    %15 = torch.aten.index_select %14, %int0_11, %arg4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,4,12],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,4,12],f32>
    %16 = torch.aten.bmm %13, %15 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,4],f32>, !torch.vtensor<[?,4,12],f32> -> !torch.vtensor<[?,1,12],f32>
    %int1_12 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %17 = torch.aten.add.Tensor %10, %16, %int1_12 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,12],f32>, !torch.vtensor<[?,1,12],f32>, !torch.int -> !torch.vtensor<[?,1,12],f32>
    return %17 : !torch.vtensor<[?,1,12],f32>
  }
}

