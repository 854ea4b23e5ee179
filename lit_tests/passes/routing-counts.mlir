// RUN: stageml-opt %s -p routing-counts | filecheck %s
// RUN: stageml-opt %s -p routing-counts,bt-verify | filecheck %s --check-prefix=VERIFY

// After bt-gather: one MoE layer whose expert LoRA factors are gathered by
// entry ids slot·E + e (E = 4 experts, 3 slots: max_adapters 2 and the base
// model's slot 0; each routed row's slot by bt-gather's elementwise product). The factorized program returns, beside its output, how
// many routed rows hit each entry, as [slots, E] with the layer's site. The
// main program (one tenant's merged stack, gathered by the expert ids)
// returns [1, E] the same way; its gather of a stack no site adapts (by
// other ids) is not counted.

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    -> (!torch.vtensor<[?,1,12],f32>, !torch.vtensor<[1,4],si64> {bt.kind = "routing", bt.name = "routing.0", bt.sites = ["experts.lora_A.default.weight"]}) attributes {bt.program = "main"}
// CHECK:         "bt.gather"(%{{[0-9]+}}, %arg4) {{.*}}stack = "leading"
// CHECK:         %[[SUM0:[0-9]+]] = torch.aten.add.Tensor
// CHECK:         %[[IOTA0:[0-9]+]] = torch.vtensor.literal(dense<[0, 1, 2, 3]> : tensor<4xsi64>)
// CHECK:         %[[COL0:[0-9]+]] = torch.aten.unsqueeze %arg4
// CHECK:         %[[HIT0:[0-9]+]] = torch.aten.eq.Tensor %[[COL0]], %[[IOTA0]] {{.*}} -> !torch.vtensor<[?,4],i1>
// CHECK:         %[[N0:[0-9]+]] = torch.aten.sum.dim_IntList %[[HIT0]], {{.*}} -> !torch.vtensor<[4],si64>
// CHECK:         %[[C0:[0-9]+]] = torch.aten.view %[[N0]], {{.*}} -> !torch.vtensor<[1,4],si64>
// CHECK-NOT:     sum.dim_IntList
// CHECK:         return %[[SUM0]], %[[C0]]

// CHECK-LABEL: func.func @main_factorized
// CHECK-SAME:    -> (!torch.vtensor<[?,1,12],f32>, !torch.vtensor<[3,4],si64> {bt.kind = "routing", bt.name = "routing.0", bt.sites = ["experts.lora_A.default.weight"]})
// CHECK:         %[[IDS:[0-9]+]] = torch.aten.add.Tensor %{{[0-9]+}}, %arg4
// CHECK:         "bt.gather"(%{{[0-9]+}}, %[[IDS]]) {{.*}}stack = "slot_entries"
// CHECK:         %[[OUT:[0-9]+]] = torch.aten.add.Tensor
// CHECK:         %[[IOTA:[0-9]+]] = torch.vtensor.literal(dense<[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]> : tensor<12xsi64>)
// CHECK:         %[[COL:[0-9]+]] = torch.aten.unsqueeze %[[IDS]]
// CHECK:         %[[HIT:[0-9]+]] = torch.aten.eq.Tensor %[[COL]], %[[IOTA]] {{.*}} -> !torch.vtensor<[?,12],i1>
// CHECK:         %[[SUM:[0-9]+]] = torch.aten.sum.dim_IntList %[[HIT]], {{.*}} -> !torch.vtensor<[12],si64>
// CHECK:         %[[COUNTS:[0-9]+]] = torch.aten.view %[[SUM]], {{.*}} -> !torch.vtensor<[3,4],si64>
// CHECK:         return %[[OUT]], %[[COUNTS]]

// VERIFY-LABEL: func.func @main(
// VERIFY-SAME:    bt.kind = "routing"
// VERIFY-LABEL: func.func @main_factorized
// VERIFY:         bt.kind = "routing"
module attributes {bt.sites = [{dtype = "float32", experts = 4 : i64, in_features = 6 : i64, lora_A = "experts.lora_A.default.weight", lora_B = "experts.lora_B.default.weight", out_features = 12 : i64, rank = 2 : i64, scaling = 2.000000e+00 : f64}], bt.tenants = {max_adapters = 2 : i64, max_rank = 4 : i64}} {
  func.func @main(%arg0: !torch.vtensor<[4,12,6],f32> {bt.name = "experts.gate_up_proj", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,6],f32> {bt.name = "experts.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[12,16],f32> {bt.name = "experts.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,1,6],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}, %arg5: !torch.vtensor<[?],si64> {bt.name = "other_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,12],f32> attributes {bt.program = "main"} {
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
    %13 = torch.aten.transpose.int %arg0, %int1, %int2 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,12,6],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,6,12],f32>
    %14 = "bt.gather"(%13, %arg5) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.0", stack = "leading", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,6,12],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,6,12],f32>
    %15 = torch.aten.bmm %arg3, %14 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,12],f32> -> !torch.vtensor<[?,1,12],f32>
    %16 = torch.aten.add.Tensor %12, %15, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,12],f32>, !torch.vtensor<[?,1,12],f32>, !torch.int -> !torch.vtensor<[?,1,12],f32>
    return %16 : !torch.vtensor<[?,1,12],f32>
  }
  func.func @main_factorized(%arg0: !torch.vtensor<[4,12,6],f32> {bt.name = "experts.gate_up_proj", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,6],f32> {bt.name = "experts.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[12,16],f32> {bt.name = "experts.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,1,6],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}, %arg5: !torch.vtensor<[?],si64> {bt.name = "adapter_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,12],f32> attributes {bt.program = "factorized"} {
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
    %int0_11 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %11 = torch.aten.size.int %arg4, %int0_11 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?],si64>, !torch.int -> !torch.int
    %int0_12 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %12 = torch.aten.size.int %arg5, %int0_12 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?],si64>, !torch.int -> !torch.int
    %13 = torch.aten.floordiv.int %11, %12 {bt.time = #bt.time<"dynamic">} : !torch.int, !torch.int -> !torch.int
    %whole_rows = torch.aten.mul.int %12, %13 {bt.time = #bt.time<"dynamic">} : !torch.int, !torch.int -> !torch.int
    %whole = torch.aten.eq.int %whole_rows, %11 {bt.time = #bt.time<"dynamic">} : !torch.int, !torch.int -> !torch.bool
    torch.runtime.assert %whole, "a LoRA site's input rows do not line up with the request rows" {bt.time = #bt.time<"dynamic">}
    %int1_13 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %14 = torch.aten.unsqueeze %arg5, %int1_13 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?,1],si64>
    %15 = torch.prim.ListConstruct %12, %13 {bt.time = #bt.time<"dynamic">} : (!torch.int, !torch.int) -> !torch.list<int>
    %none = torch.constant.none {bt.time = #bt.time<"static">}
    %int4_long = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %ones = torch.aten.ones %15, %int4_long, %none, %none, %none {bt.time = #bt.time<"dynamic">} : !torch.list<int>, !torch.int, !torch.none, !torch.none, !torch.none -> !torch.vtensor<[?,?],si64>
    %16 = torch.aten.mul.Tensor %14, %ones {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1],si64>, !torch.vtensor<[?,?],si64> -> !torch.vtensor<[?,?],si64>
    %int0_14 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1_15 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %17 = torch.aten.flatten.using_ints %16, %int0_14, %int1_15 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,?],si64>, !torch.int, !torch.int -> !torch.vtensor<[?],si64>
    %int4_16 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %18 = torch.aten.mul.Scalar %17, %int4_16 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?],si64>
    %int1_17 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %19 = torch.aten.add.Tensor %18, %arg4, %int1_17 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?],si64>, !torch.vtensor<[?],si64>, !torch.int -> !torch.vtensor<[?],si64>
    %20 = "bt.gather"(%7, %19) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.0", stack = "slot_entries", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,6,4],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,6,4],f32>
    %21 = torch.aten.bmm %arg3, %20 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,4],f32> -> !torch.vtensor<[?,1,4],f32>
    %int0_18 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %22 = "bt.gather"(%8, %19) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.1", stack = "slot_entries", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,4,12],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,12],f32>
    %23 = torch.aten.bmm %21, %22 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,4],f32>, !torch.vtensor<[?,4,12],f32> -> !torch.vtensor<[?,1,12],f32>
    %int1_19 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %24 = torch.aten.add.Tensor %10, %23, %int1_19 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,12],f32>, !torch.vtensor<[?,1,12],f32>, !torch.int -> !torch.vtensor<[?,1,12],f32>
    return %24 : !torch.vtensor<[?,1,12],f32>
  }
}

