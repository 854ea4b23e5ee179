// RUN: stageml-opt %s -p expert-factors | filecheck %s

// lora-sites' expert site after factorized-program: in the factorized program
// the routed rows' product with the merged stack permute(W + bmm(B_e, A_e))
// becomes the base expert's product plus the rank-4 per-expert product
// (x @ A_eᵀ) @ B_eᵀ, each stack indexed by the routed ids; the merged stack
// goes. The main program keeps it (it serves adapters merged).

// CHECK-LABEL: func.func @main(
// CHECK:         torch.aten.add.Tensor %arg0
// CHECK:         torch.aten.bmm %arg3
// CHECK:         return

// CHECK-LABEL: func.func @main_factorized
// CHECK:         %[[A:[0-9]+]] = torch.aten.view %arg1
// CHECK:         %[[B:[0-9]+]] = torch.aten.permute
// CHECK-SAME:      -> !torch.vtensor<[4,12,4],f32>
// CHECK:         %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, {{.*}} {bt.time = #bt.time<"static">} : {{.*}} -> !torch.vtensor<[4,6,12],f32>
// CHECK:         %[[AT:[0-9]+]] = torch.aten.transpose.int %[[A]], {{.*}} {bt.time = #bt.time<"adapter">} : {{.*}} -> !torch.vtensor<[4,6,4],f32>
// CHECK:         %[[BT:[0-9]+]] = torch.aten.transpose.int %[[B]], {{.*}} {bt.time = #bt.time<"adapter">} : {{.*}} -> !torch.vtensor<[4,4,12],f32>
// CHECK:         %[[W:[0-9]+]] = torch.aten.index_select %[[WT]], %{{.*}}, %arg4
// CHECK:         %[[Y0:[0-9]+]] = torch.aten.bmm %arg3, %[[W]] {bt.time = #bt.time<"dynamic">} : {{.*}} -> !torch.vtensor<[?,1,12],f32>
// CHECK:         %[[FA:[0-9]+]] = torch.aten.index_select %[[AT]], %{{.*}}, %arg4
// CHECK:         %[[T:[0-9]+]] = torch.aten.bmm %arg3, %[[FA]] {{.*}} -> !torch.vtensor<[?,1,4],f32>
// CHECK:         %[[FB:[0-9]+]] = torch.aten.index_select %[[BT]], %{{.*}}, %arg4
// CHECK:         %[[Y1:[0-9]+]] = torch.aten.bmm %[[T]], %[[FB]] {{.*}} -> !torch.vtensor<[?,1,12],f32>
// CHECK:         %[[Y:[0-9]+]] = torch.aten.add.Tensor %[[Y0]], %[[Y1]]
// CHECK-NOT:     torch.aten.bmm %[[B]], %[[A]]
// CHECK:         return %[[Y]]
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
    %7 = torch.aten.add.Tensor %arg0, %6, %int1_6 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.vtensor<[4,12,6],f32>, !torch.int -> !torch.vtensor<[4,12,6],f32>
    %8 = torch.prim.ListConstruct %int0, %int2, %int1 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %9 = torch.aten.permute %7, %8 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.list<int> -> !torch.vtensor<[4,6,12],f32>
    %10 = torch.aten.index_select %9, %int0, %arg4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,6,12],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,6,12],f32>
    %11 = torch.aten.bmm %arg3, %10 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,12],f32> -> !torch.vtensor<[?,1,12],f32>
    return %11 : !torch.vtensor<[?,1,12],f32>
  }
  func.func @main_factorized(%arg0: !torch.vtensor<[4,12,6],f32> {bt.name = "experts.gate_up_proj", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,6],f32> {bt.name = "experts.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[12,16],f32> {bt.name = "experts.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,1,6],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,12],f32> attributes {bt.program = "factorized"} {
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
    %7 = torch.aten.add.Tensor %arg0, %6, %int1_6 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.vtensor<[4,12,6],f32>, !torch.int -> !torch.vtensor<[4,12,6],f32>
    %8 = torch.prim.ListConstruct %int0, %int2, %int1 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %9 = torch.aten.permute %7, %8 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.list<int> -> !torch.vtensor<[4,6,12],f32>
    %10 = torch.aten.index_select %9, %int0, %arg4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,6,12],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,6,12],f32>
    %11 = torch.aten.bmm %arg3, %10 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,12],f32> -> !torch.vtensor<[?,1,12],f32>
    return %11 : !torch.vtensor<[?,1,12],f32>
  }
}

