// RUN: stageml-opt %s -p lora-sites{max-rank=4,max-adapters=2} | filecheck %s

// An expert site: PEFT's merged expert stack (LoRA through target_parameters)
// W + s·bmm(B_e, A_e), its factors in PEFT's flat layout, A [E·r, in] = [4·2, 6]
// and B [out, E·r] = [12, 2·4] (expert index fastest). Rebuilt with rank 4 per
// expert (A [16, 6], B [12, 16]) and without its scaling (the runtime stores
// s·B); described with its expert count.

// CHECK:       module attributes {bt.sites = [{dtype = "float32", experts = 4 : i64, in_features = 6 : i64, lora_A = "experts.lora_A.default.weight", lora_B = "experts.lora_B.default.weight", out_features = 12 : i64, parameter = "experts.gate_up_proj", rank = 2 : i64, scaling = 2.000000e+00 : f64}]
// CHECK-LABEL: func.func @main
// CHECK-SAME:    %arg1: !torch.vtensor<[16,6],f32> {bt.name = "experts.lora_A.default.weight"
// CHECK-SAME:    %arg2: !torch.vtensor<[12,16],f32> {bt.name = "experts.lora_B.default.weight"
// CHECK:         %[[A:[0-9]+]] = torch.aten.view %arg1, %{{[0-9]+}} {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,6],f32>, !torch.list<int> -> !torch.vtensor<[4,4,6],f32>
// CHECK:         %[[B3:[0-9]+]] = torch.aten.view %arg2, %{{[0-9]+}} {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,16],f32>, !torch.list<int> -> !torch.vtensor<[12,4,4],f32>
// CHECK:         %[[B:[0-9]+]] = torch.aten.permute %[[B3]], {{.*}} -> !torch.vtensor<[4,12,4],f32>
// CHECK:         %[[D:[0-9]+]] = torch.aten.bmm %[[B]], %[[A]] {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,4],f32>, !torch.vtensor<[4,4,6],f32> -> !torch.vtensor<[4,12,6],f32>
// CHECK-NOT:     torch.aten.mul.Scalar
// CHECK:         %[[M:[0-9]+]] = torch.aten.add.Tensor %arg0, %[[D]], %{{.*}} {bt.time = #bt.time<"adapter">}
// CHECK:         torch.aten.permute %[[M]]
// CHECK:         torch.aten.index_select
// CHECK:         torch.aten.bmm %arg3
module {
  func.func @main(%arg0: !torch.vtensor<[4,12,6],f32> {bt.name = "experts.gate_up_proj", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[8,6],f32> {bt.name = "experts.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[12,8],f32> {bt.name = "experts.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,1,6],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,12],f32> attributes {bt.program = "main"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int2 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %int4 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %int6 = torch.constant.int 6 {bt.time = #bt.time<"static">}
    %int12 = torch.constant.int 12 {bt.time = #bt.time<"static">}
    %int-1 = torch.constant.int -1 {bt.time = #bt.time<"static">}
    %float2 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
    %0 = torch.prim.ListConstruct %int4, %int-1, %int6 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %1 = torch.aten.view %arg1, %0 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,6],f32>, !torch.list<int> -> !torch.vtensor<[4,2,6],f32>
    %2 = torch.prim.ListConstruct %int12, %int-1, %int4 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %3 = torch.aten.view %arg2, %2 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,8],f32>, !torch.list<int> -> !torch.vtensor<[12,2,4],f32>
    %4 = torch.prim.ListConstruct %int2, %int0, %int1 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %5 = torch.aten.permute %3, %4 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,2,4],f32>, !torch.list<int> -> !torch.vtensor<[4,12,2],f32>
    %6 = torch.aten.bmm %5, %1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,2],f32>, !torch.vtensor<[4,2,6],f32> -> !torch.vtensor<[4,12,6],f32>
    %7 = torch.aten.mul.Scalar %6, %float2 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.float -> !torch.vtensor<[4,12,6],f32>
    %8 = torch.aten.add.Tensor %arg0, %7, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.vtensor<[4,12,6],f32>, !torch.int -> !torch.vtensor<[4,12,6],f32>
    %9 = torch.prim.ListConstruct %int0, %int2, %int1 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %10 = torch.aten.permute %8, %9 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.list<int> -> !torch.vtensor<[4,6,12],f32>
    %11 = torch.aten.index_select %10, %int0, %arg4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,6,12],f32>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,6,12],f32>
    %12 = torch.aten.bmm %arg3, %11 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f32>, !torch.vtensor<[?,6,12],f32> -> !torch.vtensor<[?,1,12],f32>
    return %12 : !torch.vtensor<[?,1,12],f32>
  }
}
